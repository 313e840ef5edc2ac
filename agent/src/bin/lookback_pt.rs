//! `lookback-pt`: Intel's ptdump and ptxed views of lookback's Intel PT decoder, for its
//! developers (`lookback::cli::pt_tool`). Users decode with `lookback decode`.
use std::process::ExitCode;

fn main() -> ExitCode {
    lookback::cli::pt_tool::main()
}
