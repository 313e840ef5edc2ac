//! Writer stage, speedscope half: speedscope's own file format (`.speedscope.json`, the
//! schema at <https://www.speedscope.app/file-format-schema.json>), as py-spy and rbspy
//! write it.
//!
//! In: [`TraceSink`] calls. Out: one `evented` profile per thread (open and close events
//! at ns timestamps), frames shared by all, the trigger's thread the profile shown first.
//! Why a format of its own: speedscope appends each Chrome JSON event's args to its name,
//! so frame names from a Chrome trace read `handle {"address":…}`; here a frame is its
//! function, with the file and line speedscope shows beside it. Instants (the trigger,
//! lost samples) have no place in the format and are left out; the Chrome and FXT traces
//! keep them. Held in memory until [`TraceSink::finish`]: the frames table comes first in
//! no particular order the format needs, but each profile's start and end must be known.

use std::collections::HashMap;
use std::io::{self, Write};

use serde::Serialize;

use super::{Arg, ArgValue, TraceSink};

/// Buffers a trace and writes it as speedscope JSON at [`TraceSink::finish`].
pub struct SpeedscopeWriter<W: Write> {
    out: W,
    frames: Vec<FrameOut>,
    frame_ids: HashMap<(String, Option<String>, Option<u64>), usize>,
    profiles: Vec<Profile>,
    by_thread: HashMap<(u32, u32), usize>,
    trigger_profile: Option<usize>,
}

#[derive(Serialize)]
struct FrameOut {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
}

struct Profile {
    name: String,
    events: Vec<EventOut>,
    /// Frames open now, innermost last.
    open: Vec<usize>,
}

impl Profile {
    /// `ts`, or the last event's time when `ts` is earlier: speedscope refuses a whole
    /// file whose events go back in time.
    fn not_before(&self, ts: u64) -> u64 {
        self.events.last().map_or(ts, |e| ts.max(e.at))
    }
}

#[derive(Serialize, Clone, Copy)]
struct EventOut {
    #[serde(rename = "type")]
    kind: &'static str,
    frame: usize,
    at: u64,
}

#[derive(Serialize)]
struct ProfileOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    events: &'a [EventOut],
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: &'a [FrameOut],
}

#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    exporter: &'static str,
    name: &'static str,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    profiles: Vec<ProfileOut<'a>>,
    shared: Shared<'a>,
}

impl<W: Write> SpeedscopeWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            profiles: Vec::new(),
            by_thread: HashMap::new(),
            trigger_profile: None,
        }
    }

    fn profile(&mut self, thread: (u32, u32)) -> &mut Profile {
        let index = *self.by_thread.entry(thread).or_insert_with(|| {
            self.profiles.push(Profile {
                name: format!("[{}] [{}]", thread.0, thread.1),
                events: Vec::new(),
                open: Vec::new(),
            });
            self.profiles.len() - 1
        });
        &mut self.profiles[index]
    }

    /// The frame of `name` with the `location` (`file:line`) or `module` of its args.
    fn frame(&mut self, name: &str, args: &[Arg<'_>]) -> usize {
        let text = |key: &str| {
            args.iter()
                .find(|a| a.name == key)
                .and_then(|a| match a.value {
                    ArgValue::Str(s) => Some(s.to_owned()),
                    _ => None,
                })
        };
        let (file, line) = match text("location") {
            Some(loc) => match loc.rsplit_once(':') {
                Some((file, line)) if line.parse::<u64>().is_ok() => {
                    (Some(file.to_owned()), line.parse().ok())
                }
                _ => (Some(loc), None),
            },
            None => (text("module"), None),
        };
        let key = (name.to_owned(), file, line);
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let id = self.frames.len();
        self.frames.push(FrameOut {
            name: key.0.clone(),
            file: key.1.clone(),
            line: key.2,
        });
        self.frame_ids.insert(key, id);
        id
    }
}

impl<W: Write> TraceSink for SpeedscopeWriter<W> {
    fn process(&mut self, _pid: u32, _name: &str) -> io::Result<()> {
        Ok(())
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        name.clone_into(&mut self.profile((pid, tid)).name);
        Ok(())
    }

    fn begin(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        let frame = self.frame(name, args);
        let profile = self.profile(thread);
        let at = profile.not_before(ts);
        profile.open.push(frame);
        profile.events.push(EventOut {
            kind: "O",
            frame,
            at,
        });
        Ok(())
    }

    fn end(&mut self, thread: (u32, u32), ts: u64, _name: &str) -> io::Result<()> {
        let profile = self.profile(thread);
        let at = profile.not_before(ts);
        if let Some(frame) = profile.open.pop() {
            profile.events.push(EventOut {
                kind: "C",
                frame,
                at,
            });
        }
        Ok(())
    }

    fn instant(
        &mut self,
        thread: (u32, u32),
        _ts: u64,
        name: &str,
        _args: &[Arg<'_>],
    ) -> io::Result<()> {
        if name.starts_with(crate::report::TRIGGER_PREFIX) {
            self.profile(thread);
            self.trigger_profile = self.by_thread.get(&thread).copied();
        }
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        let mut active = 0;
        let mut profiles = Vec::new();
        for (i, p) in self.profiles.iter_mut().enumerate() {
            // Frames still open (a trace cut at the freeze) close at the last event.
            let last = p.events.last().map_or(0, |e| e.at);
            while let Some(frame) = p.open.pop() {
                p.events.push(EventOut {
                    kind: "C",
                    frame,
                    at: last,
                });
            }
            if p.events.is_empty() {
                continue;
            }
            if self.trigger_profile == Some(i) {
                active = profiles.len();
            }
            profiles.push(i);
        }
        let doc = Document {
            schema: "https://www.speedscope.app/file-format-schema.json",
            exporter: "lookback",
            name: "lookback trace",
            active_profile_index: active,
            profiles: profiles
                .iter()
                .map(|&i| {
                    let p = &self.profiles[i];
                    ProfileOut {
                        kind: "evented",
                        name: &p.name,
                        unit: "nanoseconds",
                        start_value: p.events.first().map_or(0, |e| e.at),
                        end_value: p.events.last().map_or(0, |e| e.at),
                        events: &p.events,
                    }
                })
                .collect(),
            shared: Shared {
                frames: &self.frames,
            },
        };
        serde_json::to_writer(&mut self.out, &doc)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}
