//! Crash points (issue #36): what a crash could leave on a device, from a dm-log-writes log,
//! checked against what the host was told.
//!
//! dm-log-writes (Linux `drivers/md/dm-log-writes.c`, `Documentation/admin-guide/device-mapper/
//! log-writes.rst`) logs every write to the device below it *once it is stable*: a plain write
//! when the next flush (REQ_PREFLUSH) completes, a FUA write when it completes, in that order,
//! with the flush as an entry of its own; a mark (`dmsetup message DEV 0 mark NAME`) is logged
//! when it is asked for. Replaying the log up to any entry therefore gives the device a crash
//! at that moment could leave: what a flush made durable and nothing that was still only in a
//! volatile cache. A target that acknowledges a Flush without flushing leaves the writes before
//! it out of the log until some later flush.
//!
//! The host side is a [`Record`]: every write (its block, generation, the sequence numbers of
//! its submission and completion, FUA or not, zeroes or data) and every host Flush (sent,
//! completed, and the mark put in the log once it completed). At a mark the check is: each
//! block holds a version at least as new as the last one that completed before that Flush was
//! sent (or, with FUA, before the mark), and no newer than the last one sent before the mark; a
//! block whose content is no version of it (torn, another block's, never written) is an error
//! at every point.
//!
//! On disk (little-endian): sector 0 holds the super block (magic, version, entry count,
//! sector size); from sector 1 each entry is one sector (sector, sector count, flags, data
//! length, then a mark's name) followed, unless it is a discard, by its data.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, Write as _};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::caw;

/// `WRITE_LOG_MAGIC`.
pub const LOG_MAGIC: u64 = 0x006a_7366_7773_6872;
pub const LOG_VERSION: u64 = 1;
pub const FLAG_FLUSH: u64 = 1 << 0;
pub const FLAG_FUA: u64 = 1 << 1;
pub const FLAG_DISCARD: u64 = 1 << 2;
pub const FLAG_MARK: u64 = 1 << 3;
pub const FLAG_METADATA: u64 = 1 << 4;
const ENTRY_HEADER: usize = 32;

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    /// First sector written, in the log's sectors.
    pub sector: u64,
    pub nr_sectors: u64,
    pub flags: u64,
    /// Byte offset of the entry's data in the log (none for a discard).
    pub data_at: u64,
    /// A mark's name.
    pub mark: Option<String>,
}

impl Entry {
    pub fn is(&self, flag: u64) -> bool {
        self.flags & flag != 0
    }
}

/// A dm-log-writes log, its entries read (their data is read when replayed).
#[derive(Debug)]
pub struct Log {
    src: File,
    pub sectorsize: u64,
    pub entries: Vec<Entry>,
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Log {
    /// Reads the super block and every entry header of the log in `path` (a file or the log
    /// device itself, once the dm-log-writes device is removed so the super block is final).
    pub fn open(path: &Path) -> Result<Log, String> {
        let src = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Log::read(src).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn read(src: File) -> Result<Log, String> {
        let mut sup = [0u8; 28];
        src.read_exact_at(&mut sup, 0)
            .map_err(|e| format!("reading the super block: {e}"))?;
        if le64(&sup, 0) != LOG_MAGIC {
            return Err(format!(
                "not a dm-log-writes log (magic {:#x})",
                le64(&sup, 0)
            ));
        }
        if le64(&sup, 8) != LOG_VERSION {
            return Err(format!("log version {} (1 expected)", le64(&sup, 8)));
        }
        let count = le64(&sup, 16);
        let sectorsize = u64::from(u32::from_le_bytes(sup[24..28].try_into().expect("4")));
        if !(512..=65536).contains(&sectorsize) || !sectorsize.is_power_of_two() {
            return Err(format!("sector size {sectorsize}"));
        }
        let mut entries = Vec::with_capacity(count.min(1 << 20) as usize);
        let mut head = vec![0u8; sectorsize as usize];
        let mut pos = sectorsize;
        for index in 0..count {
            src.read_exact_at(&mut head, pos)
                .map_err(|e| format!("entry {index} at byte {pos}: {e}"))?;
            let (sector, nr_sectors, flags, data_len) = (
                le64(&head, 0),
                le64(&head, 8),
                le64(&head, 16),
                le64(&head, 24),
            );
            let known = FLAG_FLUSH | FLAG_FUA | FLAG_DISCARD | FLAG_MARK | FLAG_METADATA;
            if flags & !known != 0 || (flags == 0 && nr_sectors == 0) {
                return Err(format!(
                    "entry {index} at byte {pos} is malformed (flags {flags:#x}, {nr_sectors} sectors)"
                ));
            }
            let mark = if flags & FLAG_MARK != 0 {
                let n = (data_len as usize).min(head.len() - ENTRY_HEADER);
                let raw = &head[ENTRY_HEADER..ENTRY_HEADER + n];
                let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                Some(String::from_utf8_lossy(&raw[..end]).into_owned())
            } else {
                None
            };
            pos += sectorsize;
            let data_at = pos;
            if flags & FLAG_DISCARD == 0 {
                pos += nr_sectors * sectorsize;
            }
            entries.push(Entry {
                index,
                sector,
                nr_sectors,
                flags,
                data_at,
                mark,
            });
        }
        Ok(Log {
            src,
            sectorsize,
            entries,
        })
    }

    /// The entry's bytes on the device: (byte offset, length).
    pub fn extent(&self, e: &Entry) -> (u64, u64) {
        (e.sector * self.sectorsize, e.nr_sectors * self.sectorsize)
    }

    /// The entry's data (empty for flushes, marks and discards).
    pub fn data(&self, e: &Entry) -> Result<Vec<u8>, String> {
        let (_, len) = self.extent(e);
        if len == 0 || e.is(FLAG_MARK) || e.is(FLAG_DISCARD) {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; len as usize];
        self.src
            .read_exact_at(&mut buf, e.data_at)
            .map_err(|e2| format!("entry {} data: {e2}", e.index))?;
        Ok(buf)
    }

    /// Applies `e` to `image` (a write copies its data, a discard zeroes its range; flushes
    /// and marks change nothing). Returns the byte range it changed, if any.
    pub fn apply(&self, e: &Entry, image: &mut [u8]) -> Result<Option<(u64, u64)>, String> {
        let (off, len) = self.extent(e);
        if len == 0 || e.is(FLAG_MARK) {
            return Ok(None);
        }
        let end = off
            .checked_add(len)
            .filter(|&end| end <= image.len() as u64)
            .ok_or_else(|| {
                format!(
                    "entry {} writes bytes {off}..{} of a {}-byte device",
                    e.index,
                    off + len,
                    image.len()
                )
            })?;
        let dst = &mut image[off as usize..end as usize];
        if e.is(FLAG_DISCARD) {
            dst.fill(0);
        } else {
            self.src
                .read_exact_at(dst, e.data_at)
                .map_err(|e2| format!("entry {} data: {e2}", e.index))?;
        }
        Ok(Some((off, len)))
    }
}

/// Sequence number of an operation that never completed.
pub const NEVER: u64 = u64::MAX;

/// One write the host sent: a new generation of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    pub block: u64,
    pub gen: u64,
    /// Zeroes (Write Zeroes or Deallocate) instead of a stamped block.
    pub zero: bool,
    pub fua: bool,
    /// Sequence numbers of its submission and completion ([`NEVER`] if it failed).
    pub sub: u64,
    pub done: u64,
}

/// One host Flush and the mark put in the log after it completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flush {
    pub sub: u64,
    pub done: u64,
    /// Sequence numbers taken just before the mark was asked for and just after it was logged:
    /// a FUA write completed before the first must be there; nothing sent after the second
    /// can be.
    pub mark_before: u64,
    pub mark_after: u64,
    pub mark: String,
}

/// What the host was told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub block_size: u32,
    pub blocks: u64,
    pub writes: Vec<Write>,
    pub flushes: Vec<Flush>,
}

impl Record {
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(File::create(path)?);
        writeln!(f, "# crashpoint record v1")?;
        writeln!(f, "geometry {} {}", self.block_size, self.blocks)?;
        for w in &self.writes {
            writeln!(
                f,
                "w {} {} {} {} {} {}",
                w.block, w.gen, w.sub, w.done, w.fua as u8, w.zero as u8
            )?;
        }
        for fl in &self.flushes {
            writeln!(
                f,
                "f {} {} {} {} {}",
                fl.sub, fl.done, fl.mark_before, fl.mark_after, fl.mark
            )?;
        }
        f.flush()
    }

    pub fn load(path: &Path) -> Result<Record, String> {
        let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut r = Record::default();
        for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
            let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
            let bad = || format!("{}:{}: cannot read `{line}`", path.display(), i + 1);
            let w: Vec<&str> = line.split_whitespace().collect();
            let n = |k: usize| -> Result<u64, String> {
                w.get(k).and_then(|s| s.parse().ok()).ok_or_else(bad)
            };
            match w.first() {
                None => {}
                Some(s) if s.starts_with('#') => {}
                Some(&"geometry") => {
                    r.block_size = n(1)? as u32;
                    r.blocks = n(2)?;
                }
                Some(&"w") => r.writes.push(Write {
                    block: n(1)?,
                    gen: n(2)?,
                    sub: n(3)?,
                    done: n(4)?,
                    fua: n(5)? != 0,
                    zero: n(6)? != 0,
                }),
                Some(&"f") => r.flushes.push(Flush {
                    sub: n(1)?,
                    done: n(2)?,
                    mark_before: n(3)?,
                    mark_after: n(4)?,
                    mark: w.get(5).ok_or_else(bad)?.to_string(),
                }),
                Some(_) => return Err(bad()),
            }
        }
        if r.block_size == 0 || r.block_size % 8 != 0 || r.blocks == 0 {
            return Err(format!("{}: no geometry", path.display()));
        }
        Ok(r)
    }
}

/// What a block holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Present {
    /// All zeroes: never written, or zeroed.
    Zero,
    /// A stamped block of this generation.
    Gen(u64),
    /// Neither: torn, another block's, or foreign (why).
    Bad(String),
}

impl fmt::Display for Present {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Present::Zero => write!(f, "zeroes"),
            Present::Gen(g) => write!(f, "generation {g}"),
            Present::Bad(why) => write!(f, "a bad block ({why})"),
        }
    }
}

/// Fills `buf` (one block) with block `block`'s generation `gen`.
pub fn stamp(buf: &mut [u8], block: u64, gen: u64) {
    caw::stamp(buf, block, gen);
}

/// What `buf` (one block, number `block`) holds.
pub fn present(buf: &[u8], block: u64) -> Present {
    if buf.iter().all(|&b| b == 0) {
        return Present::Zero;
    }
    match caw::parse(buf) {
        Ok((a, g)) if a == block => Present::Gen(g),
        Ok((a, g)) => Present::Bad(format!("block {a}'s generation {g}")),
        Err(why) => Present::Bad(why),
    }
}

/// Each block's versions, for checking.
pub struct Expect {
    /// Per block: its writes in generation order (generation 0, the zeroes it starts with, is
    /// implied).
    versions: Vec<Vec<Write>>,
}

/// One finding: a point of the log where a block is not what the host may see there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub block: u64,
    pub what: String,
}

impl Expect {
    pub fn new(rec: &Record) -> Result<Expect, String> {
        let mut versions = vec![Vec::new(); rec.blocks as usize];
        for w in &rec.writes {
            versions
                .get_mut(w.block as usize)
                .ok_or_else(|| format!("a write of block {} of {}", w.block, rec.blocks))?
                .push(*w);
        }
        for (b, v) in versions.iter_mut().enumerate() {
            v.sort_by_key(|w| w.gen);
            for (i, w) in v.iter().enumerate() {
                if w.gen != i as u64 + 1 {
                    return Err(format!(
                        "block {b}: generations are not 1, 2, 3...: {:?}",
                        v.iter().map(|w| w.gen).collect::<Vec<_>>()
                    ));
                }
            }
        }
        Ok(Expect { versions })
    }

    pub fn blocks(&self) -> u64 {
        self.versions.len() as u64
    }

    /// Whether block `b` may hold `p` at a point where generation `lo` must be there and
    /// nothing newer than `hi` can be.
    fn allows(&self, b: u64, p: &Present, lo: u64, hi: u64) -> Result<(), String> {
        let v = &self.versions[b as usize];
        let zero_at = |g: u64| g == 0 || v.get(g as usize - 1).is_some_and(|w| w.zero);
        match p {
            Present::Bad(why) => Err(format!("holds {p}: {why}")),
            Present::Zero if (lo..=hi).any(zero_at) => Ok(()),
            Present::Gen(g) if (lo..=hi).contains(g) && !zero_at(*g) => Ok(()),
            Present::Gen(g) if *g as usize > v.len() || zero_at(*g) => {
                Err(format!("holds {p}, which the host never wrote"))
            }
            _ => Err(format!(
                "holds {p}; the host may see generations {lo}..={hi} here"
            )),
        }
    }

    /// The check at the mark of host flush `f`: every block's content against what the host
    /// was told by then (see the module's documentation). `present(b)` reads block `b`.
    pub fn at_mark(&self, f: &Flush, mut present: impl FnMut(u64) -> Present) -> Vec<Finding> {
        let mut out = Vec::new();
        for (b, v) in self.versions.iter().enumerate() {
            let lo = v
                .iter()
                .filter(|w| w.done < f.sub || (w.fua && w.done < f.mark_before))
                .map(|w| w.gen)
                .max()
                .unwrap_or(0);
            let hi = v
                .iter()
                .filter(|w| w.sub < f.mark_after)
                .map(|w| w.gen)
                .max()
                .unwrap_or(0);
            let p = present(b as u64);
            if let Err(why) = self.allows(b as u64, &p, lo, hi) {
                let lost = v.get(lo.max(1) as usize - 1).filter(|_| lo > 0);
                let what = match lost {
                    Some(w) if matches!(&p, Present::Zero | Present::Gen(_)) => format!(
                        "{why}: generation {lo} was {} (completed at #{}) before flush #{} was sent (lost write)",
                        if w.fua { "written with FUA" } else { "written" },
                        w.done,
                        f.sub
                    ),
                    _ => why,
                };
                out.push(Finding {
                    block: b as u64,
                    what,
                });
            }
        }
        out
    }

    /// The check at any other point: every block holds some version of itself.
    pub fn anywhere(&self, b: u64, p: &Present) -> Option<Finding> {
        let hi = self.versions[b as usize].len() as u64;
        self.allows(b, p, 0, hi)
            .err()
            .map(|what| Finding { block: b, what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log as dm-log-writes writes it (512-byte sectors): entries given as (sector, data
    /// sectors of `fill`, flags, mark).
    fn log_file(entries: &[(u64, u64, u8, u64, Option<&str>)]) -> (crate::TempDir, Log) {
        let dir = crate::TempDir::new("crashlog");
        let path = dir.0.join("log");
        let mut bytes = vec![0u8; 512];
        bytes[0..8].copy_from_slice(&LOG_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
        bytes[16..24].copy_from_slice(&(entries.len() as u64).to_le_bytes());
        bytes[24..28].copy_from_slice(&512u32.to_le_bytes());
        for &(sector, n, fill, flags, mark) in entries {
            let mut head = vec![0u8; 512];
            head[0..8].copy_from_slice(&sector.to_le_bytes());
            head[8..16].copy_from_slice(&n.to_le_bytes());
            head[16..24].copy_from_slice(&flags.to_le_bytes());
            if let Some(m) = mark {
                head[24..32].copy_from_slice(&(m.len() as u64).to_le_bytes());
                head[32..32 + m.len()].copy_from_slice(m.as_bytes());
            }
            bytes.extend_from_slice(&head);
            if flags & FLAG_DISCARD == 0 {
                bytes.extend(std::iter::repeat_n(fill, n as usize * 512));
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        let log = Log::open(&path).unwrap();
        (dir, log)
    }

    #[test]
    fn entries_marks_and_data_are_read_and_replayed_in_order() {
        let (_d, log) = log_file(&[
            (2, 2, 0xaa, 0, None),
            (0, 0, 0, FLAG_FLUSH, None),
            (0, 0, 0, FLAG_MARK, Some("flush-1")),
            (3, 1, 0, FLAG_DISCARD, None),
            (0, 1, 0xbb, FLAG_FUA, None),
        ]);
        assert_eq!(log.entries.len(), 5);
        assert_eq!(log.entries[2].mark.as_deref(), Some("flush-1"));
        assert!(log.entries[1].is(FLAG_FLUSH) && log.entries[4].is(FLAG_FUA));
        let mut image = vec![0x11u8; 8 * 512];
        let mut changed = Vec::new();
        for e in &log.entries {
            changed.push(log.apply(e, &mut image).unwrap());
        }
        assert_eq!(
            changed,
            vec![
                Some((1024, 1024)),
                None,
                None,
                Some((1536, 512)),
                Some((0, 512))
            ]
        );
        assert!(image[..512].iter().all(|&b| b == 0xbb));
        assert!(image[512..1024].iter().all(|&b| b == 0x11));
        assert!(image[1024..1536].iter().all(|&b| b == 0xaa));
        assert!(image[1536..2048].iter().all(|&b| b == 0), "discarded");
    }

    #[test]
    fn a_log_that_is_not_one_or_writes_past_the_device_is_an_error() {
        let dir = crate::TempDir::new("crashlog");
        let p = dir.0.join("zeroes");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        assert!(Log::open(&p)
            .unwrap_err()
            .contains("not a dm-log-writes log"));
        let (_d, log) = log_file(&[(14, 4, 1, 0, None)]);
        let mut small = vec![0u8; 8 * 512];
        assert!(log
            .apply(&log.entries[0], &mut small)
            .unwrap_err()
            .contains("of a 4096-byte device"));
    }

    fn w(block: u64, gen: u64, sub: u64, done: u64) -> Write {
        Write {
            block,
            gen,
            zero: false,
            fua: false,
            sub,
            done,
        }
    }

    fn flush(sub: u64, done: u64, mark: u64) -> Flush {
        Flush {
            sub,
            done,
            mark_before: mark,
            mark_after: mark,
            mark: format!("f{sub}"),
        }
    }

    #[test]
    fn a_write_completed_before_a_flush_must_be_there_at_its_mark() {
        let rec = Record {
            block_size: 512,
            blocks: 2,
            writes: vec![
                w(0, 1, 1, 2),
                // Completed after the flush was sent: may be there or not.
                w(1, 1, 3, 5),
                w(0, 2, 8, 9),
            ],
            flushes: vec![flush(4, 6, 7)],
        };
        let e = Expect::new(&rec).unwrap();
        let at = |p0: Present, p1: Present| {
            let f = &rec.flushes[0];
            e.at_mark(f, |b| if b == 0 { p0.clone() } else { p1.clone() })
        };
        assert!(at(Present::Gen(1), Present::Zero).is_empty());
        assert!(at(Present::Gen(1), Present::Gen(1)).is_empty());
        let lost = at(Present::Zero, Present::Zero);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].block, 0);
        assert!(lost[0].what.contains("lost write"), "{}", lost[0].what);
        // Generation 2 was sent after the mark: it cannot be there yet.
        assert_eq!(at(Present::Gen(2), Present::Zero).len(), 1);
        let torn = at(Present::Gen(1), Present::Bad("checksum".into()));
        assert_eq!((torn.len(), torn[0].block), (1, 1));
        // Never written by the host.
        assert!(at(Present::Gen(1), Present::Gen(7))[0]
            .what
            .contains("never wrote"));
    }

    #[test]
    fn fua_writes_and_zeroes_count_as_versions() {
        let mut fua = w(0, 1, 1, 5);
        fua.fua = true;
        let mut zero = w(1, 2, 2, 3);
        zero.zero = true;
        let rec = Record {
            block_size: 512,
            blocks: 2,
            writes: vec![fua, w(1, 1, 0, 1), zero],
            flushes: vec![flush(4, 6, 7)],
        };
        let e = Expect::new(&rec).unwrap();
        let f = &rec.flushes[0];
        // The FUA write completed before the mark: required even though the flush was sent
        // before it completed. Block 1 was zeroed (generation 2) before the flush.
        assert!(e
            .at_mark(f, |b| if b == 0 {
                Present::Gen(1)
            } else {
                Present::Zero
            })
            .is_empty());
        assert_eq!(e.at_mark(f, |_| Present::Zero).len(), 1);
        assert_eq!(
            e.at_mark(f, |_| Present::Gen(1)).len(),
            1,
            "generation 1 of block 1 was overwritten with zeroes before the flush"
        );
        assert!(e.anywhere(1, &Present::Gen(1)).is_none());
        assert!(
            e.anywhere(1, &Present::Gen(2)).is_some(),
            "generation 2 is zeroes"
        );
    }

    #[test]
    fn a_record_saves_and_loads() {
        let dir = crate::TempDir::new("crashlog");
        let p = dir.0.join("rec");
        let mut z = w(1, 1, 3, NEVER);
        z.zero = true;
        let rec = Record {
            block_size: 4096,
            blocks: 9,
            writes: vec![w(0, 1, 1, 2), z],
            flushes: vec![flush(4, 6, 7)],
        };
        rec.save(&p).unwrap();
        assert_eq!(Record::load(&p).unwrap(), rec);
        std::fs::write(&p, "geometry 4096 9\nw 1 x\n").unwrap();
        assert!(Record::load(&p).unwrap_err().contains(":2: cannot read"));
    }

    #[test]
    fn a_stamped_block_reads_as_its_generation() {
        let mut b = vec![0u8; 4096];
        assert_eq!(present(&b, 3), Present::Zero);
        stamp(&mut b, 3, 7);
        assert_eq!(present(&b, 3), Present::Gen(7));
        assert!(matches!(present(&b, 4), Present::Bad(_)));
        b[2000] ^= 1;
        assert!(matches!(present(&b, 3), Present::Bad(_)));
    }
}
