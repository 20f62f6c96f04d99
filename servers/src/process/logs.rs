//! Reading the end of a child's logs, for error messages and assertions.
//!
//! Only the last bytes of each file are read, so a chatty server cannot make an error
//! message huge. Stack-trace frames (ClickHouse prints `12. /lib/...` lines after each
//! error) are left out: the line that says what went wrong is what a reader needs.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// At most this many bytes are read from the end of each file.
const TAIL_BYTES: u64 = 64 * 1024;

/// The last `lines` lines of the file at `path` (stack frames skipped), or a note saying
/// why it could not be read.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match read_end(path) {
        Ok(text) => {
            let kept: Vec<&str> = text
                .lines()
                .filter(|line| !is_stack_frame(line) && !line.trim().is_empty())
                .collect();
            let start = kept.len().saturating_sub(lines);
            kept[start..].join("\n")
        }
        Err(error) => format!("(cannot read {}: {error})", path.display()),
    }
}

/// Whether `needle` occurs in the last bytes of the file at `path`.
pub(crate) fn contains(path: &Path, needle: &str) -> bool {
    read_end(path).is_ok_and(|text| text.contains(needle))
}

fn read_end(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `12. /lib/x86_64-linux-gnu/libclickhouse.so(...)` and similar frame lines.
fn is_stack_frame(line: &str) -> bool {
    let trimmed = line.trim_start();
    let digits = trimmed.len()
        - trimmed
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .len();
    digits > 0 && trimmed[digits..].starts_with(". ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_frames_are_recognised() {
        assert!(is_stack_frame(
            "12. /lib/x86_64-linux-gnu/libPocoNet.so.80(Poco::Net::X::run()+0x26d) [0x7f]"
        ));
        assert!(!is_stack_frame("2026.11.30 12:15:46 <Error> Code: 164."));
        assert!(!is_stack_frame("Code: 60. DB::Exception"));
    }

    #[test]
    fn tail_keeps_the_last_lines() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("log");
        std::fs::write(&path, "one\ntwo\n0. /frame\nthree\n")?;
        assert_eq!(tail(&path, 2), "two\nthree");
        assert!(contains(&path, "three"));
        assert!(tail(&dir.path().join("missing"), 2).starts_with("(cannot read"));
        Ok(())
    }
}
