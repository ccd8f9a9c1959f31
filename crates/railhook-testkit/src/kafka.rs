//! A private, single-node Kafka broker for tests that stop and restart Kafka. (Being written.)
