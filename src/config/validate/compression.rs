//! `[api] compression`, `compression_level`, `compress_from`, `compress_above`: how the
//! ingest API stores each message (`nats::encoding`).

use super::{Check, Key};
use crate::config::file::{ApiFile, CompressionMode};
use crate::config::Compression;

/// The zstd levels taken: the usual 1 to 19, and the fast ones down to -7 (0 would mean
/// zstd's default, 3; 20 and above need "ultra" windows that cost far more memory).
const LEVELS: std::ops::RangeInclusive<i32> = -7..=19;

pub(super) fn api(c: &mut Check, a: &ApiFile, section: &Key) -> Option<Compression> {
    if a.compression == CompressionMode::None {
        return None;
    }
    if !LEVELS.contains(&a.compression_level) || a.compression_level == 0 {
        c.problem(
            &[&section.key("compression_level")],
            format!(
                "[api] compression_level = {}: zstd's levels are 1 (fastest of the usual) to 19 (smallest), or -7 to -1 (faster still)",
                a.compression_level
            ),
        );
    }
    Some(Compression {
        level: a.compression_level,
        from_bytes: a.compress_from.as_usize(),
        while_above: a.compress_above,
    })
}
