//! Prometheus API answers decoded as they arrive, so that memory follows what one series
//! needs, not what the server sends.
//!
//! An answer's body reaches a [`ChunkReader`] a few chunks at a time (each chunk holds
//! permits of a byte budget shared by every query of the source until it is parsed), and
//! serde_json reads the envelope from it on a blocking thread. The series of a range
//! answer, or the entries of a series lookup, are handed on one by one as compact samples:
//! nothing else of the answer is kept, and labels other than the container's three are
//! skipped without being stored.
//!
//! Every answer is bounded by [`AnswerLimits`]: its bytes, its series, the samples of one
//! series (the query's own steps) and the bytes of one series or entry, labels included.
//! A hostile or broken server that exceeds one is refused with what it sent too much of.

use std::cell::Cell;
use std::fmt;
use std::io::Read;
use std::rc::Rc;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::Receiver;

use super::ContainerKey;
use super::prometheus::LabelNames;

/// What one answer may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerLimits {
    /// Bytes of the whole body.
    pub max_bytes: u64,
    /// Series of a range answer, or entries of a series lookup.
    pub max_series: usize,
    /// Samples of one series.
    pub max_samples: usize,
    /// Bytes of one series or entry, its labels included.
    pub max_element_bytes: u64,
}

impl AnswerLimits {
    /// Limits for a range answer of at most `series` series of `samples` samples each,
    /// within `max_bytes`: a sample takes about 30 bytes of JSON, 64 is allowed, and
    /// 64 KiB more for a series' labels.
    pub fn range(max_bytes: u64, series: usize, samples: usize) -> Self {
        AnswerLimits {
            max_bytes,
            max_series: series,
            max_samples: samples,
            max_element_bytes: samples as u64 * 64 + (64 << 10),
        }
    }
}

/// A part of an answer's body, holding its share of the in-flight byte budget until it
/// has been parsed.
pub struct Chunk {
    bytes: bytes::Bytes,
    _budget: OwnedSemaphorePermit,
}

impl Chunk {
    /// `bytes`, holding `budget` until parsed.
    pub fn new(bytes: bytes::Bytes, budget: OwnedSemaphorePermit) -> Self {
        Chunk {
            bytes,
            _budget: budget,
        }
    }
}

/// Which limit an answer broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// The body was longer than this many bytes.
    Bytes(u64),
    /// One series or entry was longer than this many bytes.
    ElementBytes(u64),
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exceeded::Bytes(cap) => write!(
                f,
                "the answer is larger than the {cap} bytes read at most \
                 (--prometheus-max-response-bytes); fewer points per query make smaller answers"
            ),
            Exceeded::ElementBytes(cap) => write!(
                f,
                "one series of the answer is larger than {cap} bytes, more than its samples \
                 and labels can take"
            ),
        }
    }
}

/// The body as a blocking reader, for serde_json on a blocking thread: chunks come from
/// the task reading the response, and each is released once read.
pub struct ChunkReader {
    chunks: Receiver<Chunk>,
    current: Option<Chunk>,
    offset: usize,
    total: u64,
    limits: AnswerLimits,
    /// What the decoder shares with the reader.
    progress: Rc<Progress>,
    exceeded: Option<Exceeded>,
}

/// Shared by the reader and the decoder on the parsing thread.
#[derive(Default)]
struct Progress {
    /// Bytes read since the current series or entry began; reset by the decoder.
    element: Cell<u64>,
    /// Whether the decoder refused the answer for a limit.
    limit: Cell<bool>,
}

/// Why an answer could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerError {
    /// It broke one of its limits (it may be valid JSON).
    pub limit: bool,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl ChunkReader {
    /// A reader of the chunks sent on `chunks`, within `limits`.
    pub fn new(chunks: Receiver<Chunk>, limits: AnswerLimits) -> Self {
        ChunkReader {
            chunks,
            current: None,
            offset: 0,
            total: 0,
            limits,
            progress: Rc::default(),
            exceeded: None,
        }
    }

    /// The limit the body broke, if it broke one.
    pub fn exceeded(&self) -> Option<Exceeded> {
        self.exceeded
    }

    /// Decodes the answer's envelope with `data` reading its `data` field: the status, the
    /// data (when the answer has it) and Prometheus' error message.
    pub fn decode<T, D>(&mut self, data: D) -> Result<Envelope<T>, AnswerError>
    where
        D: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let progress = self.progress.clone();
        let envelope = {
            let mut de = serde_json::Deserializer::from_reader(&mut *self);
            EnvelopeSeed {
                data: Some(data),
                progress,
            }
            .deserialize(&mut de)
            .and_then(|e| de.end().map(|()| e))
        };
        match (envelope, self.exceeded) {
            (_, Some(exceeded)) => Err(AnswerError {
                limit: true,
                message: exceeded.to_string(),
            }),
            (Ok(e), None) => Ok(e),
            (Err(e), None) => Err(AnswerError {
                limit: self.progress.limit.get(),
                message: e.to_string(),
            }),
        }
    }

    fn count(&mut self, n: usize) -> std::io::Result<()> {
        self.total += n as u64;
        let element = self.progress.element.get() + n as u64;
        self.progress.element.set(element);
        let exceeded = if self.total > self.limits.max_bytes {
            Some(Exceeded::Bytes(self.limits.max_bytes))
        } else if element > self.limits.max_element_bytes {
            Some(Exceeded::ElementBytes(self.limits.max_element_bytes))
        } else {
            None
        };
        match exceeded {
            Some(e) => {
                self.exceeded = Some(e);
                Err(std::io::Error::other(e.to_string()))
            }
            None => Ok(()),
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(chunk) = &self.current
                && self.offset < chunk.bytes.len()
            {
                let n = buf.len().min(chunk.bytes.len() - self.offset);
                buf[..n].copy_from_slice(&chunk.bytes[self.offset..self.offset + n]);
                self.offset += n;
                self.count(n)?;
                return Ok(n);
            }
            // The chunk read is dropped here, and its budget given back.
            self.current = None;
            self.offset = 0;
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = Some(chunk),
                None => return Ok(0),
            }
        }
    }
}

/// An answer's envelope.
#[derive(Debug)]
pub struct Envelope<T> {
    /// `success` or `error`.
    pub status: String,
    /// The data, when the answer has it.
    pub data: Option<T>,
    /// Prometheus' error message.
    pub error: Option<String>,
}

struct EnvelopeSeed<D> {
    data: Option<D>,
    progress: Rc<Progress>,
}

impl<'de, T, D> DeserializeSeed<'de> for EnvelopeSeed<D>
where
    D: DeserializeSeed<'de, Value = T>,
{
    type Value = Envelope<T>;

    fn deserialize<De: Deserializer<'de>>(self, de: De) -> Result<Self::Value, De::Error> {
        de.deserialize_map(self)
    }
}

impl<'de, T, D> Visitor<'de> for EnvelopeSeed<D>
where
    D: DeserializeSeed<'de, Value = T>,
{
    type Value = Envelope<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Prometheus API answer (an object with status and data)")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Envelope {
            status: String::new(),
            data: None,
            error: None,
        };
        let mut has_status = false;
        while let Some(key) = map.next_key::<Key>()? {
            self.progress.element.set(0);
            match key.0.as_deref() {
                Some("status") => {
                    out.status = map.next_value()?;
                    has_status = true;
                }
                Some("error") => out.error = map.next_value()?,
                Some("data") => match self.data.take() {
                    Some(seed) => out.data = Some(map.next_value_seed(seed)?),
                    None => return Err(de::Error::duplicate_field("data")),
                },
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !has_status {
            return Err(de::Error::missing_field("status"));
        }
        Ok(out)
    }
}

/// A map key kept only when it is one of the few a decoder reads (it is short then), so a
/// long unknown key costs no memory beyond serde_json's scratch.
struct Key(Option<String>);

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key((v.len() <= 16).then(|| v.to_string())))
            }
        }
        de.deserialize_str(V)
    }
}

/// Label sets, of which only the container's three labels are kept.
struct LabelsSeed<'a> {
    names: &'a LabelNames,
}

#[derive(Default)]
struct Found {
    namespace: Option<String>,
    pod: Option<String>,
    container: Option<String>,
}

impl Found {
    fn key(self) -> Option<ContainerKey> {
        Some(ContainerKey {
            namespace: self.namespace?,
            pod: self.pod?,
            container: self.container?,
        })
    }
}

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = Option<ContainerKey>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = Option<ContainerKey>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a series' labels")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Found::default();
        while let Some(name) = map.next_key_seed(LabelName(self.names))? {
            match name {
                Which::Namespace => found.namespace = Some(map.next_value()?),
                Which::Pod => found.pod = Some(map.next_value()?),
                Which::Container => found.container = Some(map.next_value()?),
                Which::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found.key())
    }
}

enum Which {
    Namespace,
    Pod,
    Container,
    Other,
}

struct LabelName<'a>(&'a LabelNames);

impl<'de> DeserializeSeed<'de> for LabelName<'_> {
    type Value = Which;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Which, D::Error> {
        de.deserialize_str(self)
    }
}

impl Visitor<'_> for LabelName<'_> {
    type Value = Which;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a label name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Which, E> {
        Ok(if v == self.0.namespace {
            Which::Namespace
        } else if v == self.0.pod {
            Which::Pod
        } else if v == self.0.container {
            Which::Container
        } else {
            Which::Other
        })
    }
}

/// The `data` of a series lookup: an array of label sets, each handed to `each` as the
/// container it names (entries that name none are skipped).
pub struct SeriesList<'a, F> {
    /// The label names of the container series.
    pub names: &'a LabelNames,
    /// The limits: `max_series` entries.
    pub limits: AnswerLimits,
    /// Where each entry goes; an error refuses the answer as over a limit.
    pub each: F,
    progress: Rc<Progress>,
}

impl<'a, F> SeriesList<'a, F> {
    /// Decodes entries with `names` into `each` within `limits`, for `reader`.
    pub fn new(reader: &ChunkReader, names: &'a LabelNames, limits: AnswerLimits, each: F) -> Self {
        SeriesList {
            names,
            limits,
            each,
            progress: reader.progress.clone(),
        }
    }
}

impl<'de, F> DeserializeSeed<'de> for SeriesList<'_, F>
where
    F: FnMut(ContainerKey) -> Result<(), String>,
{
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<usize, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de, F> Visitor<'de> for SeriesList<'_, F>
where
    F: FnMut(ContainerKey) -> Result<(), String>,
{
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of series")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0;
        loop {
            self.progress.element.set(0);
            let Some(key) = seq.next_element_seed(LabelsSeed { names: self.names })? else {
                return Ok(n);
            };
            n += 1;
            if n > self.limits.max_series {
                self.progress.limit.set(true);
                return Err(de::Error::custom(format!(
                    "the answer lists more than {} series",
                    self.limits.max_series
                )));
            }
            if let Some(key) = key
                && let Err(e) = (self.each)(key)
            {
                self.progress.limit.set(true);
                return Err(de::Error::custom(e));
            }
        }
    }
}

/// The `data` of a range answer: `{resultType: "matrix", result: [...]}`, each series
/// handed to `each` with its container (when its labels name one) and its samples.
pub struct Matrix<'a, F> {
    /// The label names of the container series.
    pub names: &'a LabelNames,
    /// The limits: `max_series` series of `max_samples` samples.
    pub limits: AnswerLimits,
    /// Where each series goes; an error stops the answer.
    pub each: F,
    progress: Rc<Progress>,
}

impl<'a, F> Matrix<'a, F> {
    /// Decodes series with `names` into `each` within `limits`, for `reader`.
    pub fn new(reader: &ChunkReader, names: &'a LabelNames, limits: AnswerLimits, each: F) -> Self {
        Matrix {
            names,
            limits,
            each,
            progress: reader.progress.clone(),
        }
    }
}

/// What a range answer held: series and samples.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MatrixRead {
    /// Series in the answer.
    pub series: usize,
}

impl<'de, F> DeserializeSeed<'de> for Matrix<'_, F>
where
    F: FnMut(Option<ContainerKey>, Vec<(i64, f64)>) -> Result<(), String>,
{
    type Value = MatrixRead;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<MatrixRead, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de, F> Visitor<'de> for Matrix<'_, F>
where
    F: FnMut(Option<ContainerKey>, Vec<(i64, f64)>) -> Result<(), String>,
{
    type Value = MatrixRead;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a range vector (resultType and result)")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<MatrixRead, A::Error> {
        let mut read = MatrixRead::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key.0.as_deref() {
                Some("resultType") => {
                    let kind: String = map.next_value()?;
                    if kind != "matrix" {
                        let kind = match kind.as_str() {
                            "vector" => "an instant vector",
                            "scalar" => "a scalar",
                            "string" => "a string",
                            _ => "an unknown result type",
                        };
                        return Err(de::Error::custom(format!(
                            "expected a range vector, got {kind}"
                        )));
                    }
                }
                Some("result") => {
                    read.series += map.next_value_seed(SeriesSeq {
                        names: self.names,
                        limits: self.limits,
                        each: &mut self.each,
                        progress: &self.progress,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(read)
    }
}

struct SeriesSeq<'a, 'b, F> {
    names: &'a LabelNames,
    limits: AnswerLimits,
    each: &'b mut F,
    progress: &'b Rc<Progress>,
}

impl<'de, F> DeserializeSeed<'de> for SeriesSeq<'_, '_, F>
where
    F: FnMut(Option<ContainerKey>, Vec<(i64, f64)>) -> Result<(), String>,
{
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<usize, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de, F> Visitor<'de> for SeriesSeq<'_, '_, F>
where
    F: FnMut(Option<ContainerKey>, Vec<(i64, f64)>) -> Result<(), String>,
{
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of series")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0;
        loop {
            self.progress.element.set(0);
            let Some((key, samples)) = seq.next_element_seed(OneSeries {
                names: self.names,
                max_samples: self.limits.max_samples,
                progress: self.progress,
            })?
            else {
                return Ok(n);
            };
            n += 1;
            if n > self.limits.max_series {
                self.progress.limit.set(true);
                return Err(de::Error::custom(format!(
                    "the answer holds more than {} series, more than the query covers",
                    self.limits.max_series
                )));
            }
            (self.each)(key, samples).map_err(de::Error::custom)?;
        }
    }
}

struct OneSeries<'a> {
    names: &'a LabelNames,
    max_samples: usize,
    progress: &'a Progress,
}

impl<'de> DeserializeSeed<'de> for OneSeries<'_> {
    type Value = (Option<ContainerKey>, Vec<(i64, f64)>);

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for OneSeries<'_> {
    type Value = (Option<ContainerKey>, Vec<(i64, f64)>);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a series (metric and values)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut key = None;
        let mut samples = Vec::new();
        while let Some(field) = map.next_key::<Key>()? {
            match field.0.as_deref() {
                Some("metric") => key = map.next_value_seed(LabelsSeed { names: self.names })?,
                Some("values") => {
                    samples = map.next_value_seed(Samples {
                        max: self.max_samples,
                        of: key.as_ref(),
                        progress: self.progress,
                    })?;
                }
                Some("value") => {
                    return Err(de::Error::custom(
                        "expected a range vector, got an instant vector",
                    ));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((key, samples))
    }
}

/// A series' `[[time, "value"], ...]`, at most `max` of them.
struct Samples<'a> {
    max: usize,
    of: Option<&'a ContainerKey>,
    progress: &'a Progress,
}

impl<'de> DeserializeSeed<'de> for Samples<'_> {
    type Value = Vec<(i64, f64)>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Samples<'_> {
    type Value = Vec<(i64, f64)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of [time, value] samples")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max));
        while let Some(Sample(t, v)) = seq.next_element()? {
            if out.len() == self.max {
                self.progress.limit.set(true);
                let series = match self.of {
                    Some(k) => format!("series {}/{}/{}", k.namespace, k.pod, k.container),
                    None => "a series".to_string(),
                };
                return Err(de::Error::custom(format!(
                    "{series} has more than {} samples, more than the query has steps",
                    self.max
                )));
            }
            out.push((t, v));
        }
        Ok(out)
    }
}

/// One `[time, "value"]` pair; Prometheus writes values as strings, `NaN` and `±Inf`
/// included.
struct Sample(i64, f64);

impl<'de> serde::Deserialize<'de> for Sample {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Sample;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a [time, \"value\"] pair")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Sample, A::Error> {
                let t: f64 = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let v = seq
                    .next_element::<Value>()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(3, &self));
                }
                Ok(Sample(t as i64, v.0))
            }
        }
        de.deserialize_seq(V)
    }
}

/// A sample value written as a string.
struct Value(f64);

impl<'de> serde::Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sample value as a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
                let parsed = match v {
                    "NaN" => Some(f64::NAN),
                    "+Inf" | "Inf" => Some(f64::INFINITY),
                    "-Inf" => Some(f64::NEG_INFINITY),
                    _ => v.parse().ok(),
                };
                parsed.map(Value).ok_or_else(|| {
                    let shown: String = v.chars().take(32).collect();
                    E::custom(format!("sample value {shown:?} is not a number"))
                })
            }
        }
        de.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    type Decoded = (
        Envelope<MatrixRead>,
        Vec<(Option<ContainerKey>, Vec<(i64, f64)>)>,
    );

    /// Decodes `body`, sent in `chunk`-byte chunks, as a range answer within `limits`.
    fn matrix(body: &str, chunk: usize, limits: AnswerLimits) -> Result<Decoded, String> {
        let (tx, rx) = tokio::sync::mpsc::channel(body.len() / chunk + 2);
        let budget = Arc::new(Semaphore::new(1 << 20));
        for part in body.as_bytes().chunks(chunk) {
            let permit = budget
                .clone()
                .try_acquire_many_owned(part.len() as u32)
                .expect("budget");
            tx.try_send(Chunk::new(bytes::Bytes::copy_from_slice(part), permit))
                .map_err(|_| "send")
                .expect("room");
        }
        drop(tx);
        let names = LabelNames::default();
        let mut reader = ChunkReader::new(rx, limits);
        let mut seen = Vec::new();
        let seed = Matrix::new(&reader, &names, limits, |k, s| {
            seen.push((k, s));
            Ok(())
        });
        let envelope = reader.decode(seed).map_err(|e| {
            // Only the limits are reported as limits.
            let limit = e.message.contains("more than") || e.message.contains("larger than");
            assert_eq!(e.limit, limit, "{e:?}");
            e.message
        })?;
        // Every chunk was released once parsed.
        assert_eq!(budget.available_permits(), 1 << 20);
        Ok((envelope, seen))
    }

    fn loose() -> AnswerLimits {
        AnswerLimits::range(1 << 20, 10, 10)
    }

    const LABELS: &str =
        r#"{"__name__":"x","namespace":"shop","pod":"web-1","container":"app","image":"i"}"#;

    #[test]
    fn a_range_answer_is_decoded_series_by_series_in_any_chunking() {
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{LABELS},"values":[[1.5,"0.25"],[2,"NaN"],[3,"+Inf"]]}},{{"metric":{{"job":"x"}},"values":[[1,"1"]]}}]}},"warnings":["w"]}}"#
        );
        for chunk in [1, 7, 4096] {
            let (envelope, seen) = matrix(&body, chunk, loose()).expect("decodes");
            assert_eq!(envelope.status, "success");
            assert_eq!(envelope.data, Some(MatrixRead { series: 2 }));
            assert_eq!(seen.len(), 2);
            let key = seen[0].0.as_ref().expect("a container");
            assert_eq!(
                (key.namespace.as_str(), key.pod.as_str()),
                ("shop", "web-1")
            );
            assert_eq!(seen[0].1[0], (1, 0.25));
            assert!(seen[0].1[1].1.is_nan() && seen[0].1[2].1 == f64::INFINITY);
            assert!(seen[1].0.is_none());
        }
    }

    #[test]
    fn an_error_answer_carries_its_message() {
        let body = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        let (envelope, seen) = matrix(body, 5, loose()).expect("decodes");
        assert_eq!(envelope.status, "error");
        assert_eq!(envelope.error.as_deref(), Some("parse error at char 3"));
        assert!(envelope.data.is_none() && seen.is_empty());
    }

    #[test]
    fn answers_past_a_limit_are_refused_naming_it() {
        let series = |n: usize, samples: usize| {
            let values: Vec<String> = (0..samples).map(|i| format!("[{i},\"1\"]")).collect();
            let one = format!(r#"{{"metric":{LABELS},"values":[{}]}}"#, values.join(","));
            format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{}]}}}}"#,
                vec![one; n].join(",")
            )
        };
        let err = matrix(&series(11, 1), 64, loose()).expect_err("too many series");
        assert!(err.contains("more than 10 series"), "{err}");
        let err = matrix(&series(1, 11), 64, loose()).expect_err("too many samples");
        assert!(
            err.contains("series shop/web-1/app has more than 10 samples"),
            "{err}"
        );
        let long_label = format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{"pad":"{}"}},"values":[]}}]}}}}"#,
            "x".repeat(100_000)
        );
        let err = matrix(&long_label, 4096, loose()).expect_err("too long a series");
        assert!(
            err.contains("one series of the answer is larger than"),
            "{err}"
        );
        let err =
            matrix(&series(10, 10), 64, AnswerLimits::range(500, 10, 10)).expect_err("too large");
        assert!(err.contains("larger than the 500 bytes"), "{err}");
        // Within every limit, the same answers pass.
        assert_eq!(
            matrix(&series(10, 10), 64, loose()).expect("fits").1.len(),
            10
        );
    }

    #[test]
    fn an_instant_vector_or_a_bad_value_is_refused() {
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let err = matrix(vector, 8, loose()).expect_err("vector");
        assert!(
            err.contains("expected a range vector, got an instant vector"),
            "{err}"
        );
        let value = format!(
            r#"{{"status":"success","data":{{"result":[{{"metric":{LABELS},"value":[1,"2"]}}]}}}}"#
        );
        let err = matrix(&value, 8, loose()).expect_err("vector without resultType");
        assert!(err.contains("got an instant vector"), "{err}");
        let bad = format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{LABELS},"values":[[1,"lots"]]}}]}}}}"#
        );
        let err = matrix(&bad, 8, loose()).expect_err("not a number");
        assert!(
            err.contains("sample value \"lots\" is not a number"),
            "{err}"
        );
        let err = matrix("{\"data\":{}}", 8, loose()).expect_err("no status");
        assert!(err.contains("missing field `status`"), "{err}");
        let err = matrix("{\"status\":\"success\"", 8, loose()).expect_err("cut short");
        assert!(err.contains("EOF"), "{err}");
    }
}
