//! Rules: the YAML model of contract.md, validated with source positions.
