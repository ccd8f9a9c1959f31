//! The dead-letter topic (`kafka_source.dead_letter_topic`): a record that cannot become an
//! Event is produced there as it arrived (key, value and headers), with headers saying why
//! and where it came from. Its offset is committed only after the broker acknowledged the
//! copy (`acks=all`, idempotent producer), so a refused record is never dropped: at worst,
//! after a crash between the two, it is in the dead-letter topic twice.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::error::SourceError;
use crate::record::{Record, Refusal};

/// The headers added to a dead-lettered record.
pub const REASON_HEADER: &str = "railhook-dead-letter-reason";
pub const MESSAGE_HEADER: &str = "railhook-dead-letter-message";
pub const TOPIC_HEADER: &str = "railhook-source-topic";
pub const PARTITION_HEADER: &str = "railhook-source-partition";
pub const OFFSET_HEADER: &str = "railhook-source-offset";

/// How long one produce may wait in the client's queue and for the acknowledgement before
/// the batch is made again.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

pub struct DeadLetters {
    producer: FutureProducer,
    topic: String,
}

impl DeadLetters {
    pub fn new(producer: FutureProducer, topic: String) -> DeadLetters {
        DeadLetters { producer, topic }
    }

    /// Produces each refused record and waits for every acknowledgement (sent together).
    pub async fn send(&self, refused: &[(Record<'_>, Option<&[u8]>, Refusal)]) -> Result<(), SourceError> {
        let sends = refused.iter().map(|(record, key, refusal)| {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 5);
            for (k, v) in &record.headers {
                headers = headers.insert(Header { key: k, value: *v });
            }
            let (partition, offset) = (record.partition.to_string(), record.offset.to_string());
            headers = headers
                .insert(Header { key: REASON_HEADER, value: Some(refusal.reason.as_str()) })
                .insert(Header { key: MESSAGE_HEADER, value: Some(refusal.message.as_str()) })
                .insert(Header { key: TOPIC_HEADER, value: Some(record.topic) })
                .insert(Header { key: PARTITION_HEADER, value: Some(partition.as_str()) })
                .insert(Header { key: OFFSET_HEADER, value: Some(offset.as_str()) });
            let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic).headers(headers);
            if let Some(k) = key {
                out = out.key(k);
            }
            if let Some(v) = record.value {
                out = out.payload(v);
            }
            self.producer.send(out, SEND_TIMEOUT)
        });
        for result in futures::future::join_all(sends).await {
            result.map_err(|(e, _)| SourceError::unavailable(format!("producing to the dead-letter topic {}", self.topic), e))?;
        }
        Ok(())
    }
}
