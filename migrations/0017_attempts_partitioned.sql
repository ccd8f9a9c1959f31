-- The attempt log, partitioned by day for retention (issue 17).
--
-- `attempts` becomes a table partitioned by range on `started_at`, one partition per UTC day
-- (`attempts_pYYYYMMDD`), so retention drops a whole day's partition instead of deleting rows
-- (`railhook_store::attempts::drop_partitions_before`). Partitions are made ahead of time by
-- `railhook_attempt_partition` (the worker calls `railhook_store::attempts::ensure_partitions`
-- at start and every hour); `attempts_default` takes an Attempt whose day has no partition yet,
-- so a finalise never fails for want of one, and the next ensure moves such rows into their
-- day's new partition.
--
-- The primary key includes the partition key: (id, started_at). A finalise made again after a
-- lost reply carries the same id and started_at, so `ON CONFLICT (id, started_at)` still
-- records the Attempt once. The reads' indexes are the same as before, per partition.
--
-- New column: `request_headers`, the headers the Attempt sent (signature included; credential
-- values redacted by the worker). The text and jsonb columns use lz4 for TOAST compression
-- (Postgres compresses a row's largest values once the row exceeds about 2 KB; lz4 costs the
-- finalise a fraction of pglz's CPU at a similar size: docs/ARCHITECTURE.md "The attempt log").
--
-- The existing rows are copied in this migration (one INSERT ... SELECT, under the migration
-- lock: with many millions of Attempts, expect minutes), into partitions made for every day
-- they cover.

ALTER TABLE attempts RENAME TO attempts_before_0017;
ALTER INDEX attempts_pkey RENAME TO attempts_before_0017_pkey;
ALTER INDEX attempts_delivery_idx RENAME TO attempts_before_0017_delivery_idx;
ALTER INDEX attempts_forward_idx RENAME TO attempts_before_0017_forward_idx;
ALTER TABLE attempts_before_0017 RENAME CONSTRAINT attempts_check TO attempts_before_0017_check;
ALTER TABLE attempts_before_0017 RENAME CONSTRAINT attempts_project_id_fkey TO attempts_before_0017_project_id_fkey;
ALTER TABLE attempts_before_0017 RENAME CONSTRAINT attempts_delivery_id_fkey TO attempts_before_0017_delivery_id_fkey;
ALTER TABLE attempts_before_0017 RENAME CONSTRAINT attempts_forward_id_fkey TO attempts_before_0017_forward_id_fkey;

CREATE TABLE attempts (
    id                 uuid NOT NULL,
    project_id         uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    delivery_id        uuid REFERENCES deliveries (id) ON DELETE CASCADE,
    forward_id         uuid REFERENCES forwards (id) ON DELETE CASCADE,
    attempt_number     integer NOT NULL,
    -- The worker's clock when the request started; the partition key.
    started_at         timestamptz NOT NULL,
    duration_ms        integer NOT NULL,
    status_code        integer,
    -- The error class: success, http_status, timeout, connect, dns, tls, refused_address,
    -- protocol, request.
    result             text NOT NULL,
    error_message      text COMPRESSION lz4,
    -- Name (lower case) to value, as sent; credentials redacted. NULL for Attempts recorded
    -- before migration 0017 (or by a worker of an older build).
    request_headers    jsonb COMPRESSION lz4,
    response_headers   jsonb COMPRESSION lz4,
    response_body      text COMPRESSION lz4,
    response_truncated boolean NOT NULL DEFAULT false,
    PRIMARY KEY (id, started_at),
    CHECK ((delivery_id IS NULL) <> (forward_id IS NULL))
) PARTITION BY RANGE (started_at);
CREATE INDEX attempts_delivery_idx ON attempts (delivery_id, attempt_number) WHERE delivery_id IS NOT NULL;
CREATE INDEX attempts_forward_idx ON attempts (forward_id, attempt_number) WHERE forward_id IS NOT NULL;

CREATE TABLE attempts_default PARTITION OF attempts DEFAULT;

-- Makes the partition of one UTC day unless it exists; returns its name, or NULL when it
-- existed. The table is made apart and attached (ATTACH takes SHARE UPDATE EXCLUSIVE on
-- `attempts`, which the finalise's inserts do not wait for; CREATE TABLE ... PARTITION OF
-- would take ACCESS EXCLUSIVE), after moving into it the rows of that day the default
-- partition holds (ATTACH refuses while the default holds any). Concurrent callers are
-- serialised by an advisory lock held until their transaction ends; `lock_timeout` (5 s,
-- this transaction only) keeps a caller from queueing the live traffic behind it for long.
CREATE FUNCTION railhook_attempt_partition(p_day date) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    name text := 'attempts_p' || to_char(p_day, 'YYYYMMDD');
    lo timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('railhook_attempt_partitions', 17));
    IF to_regclass(quote_ident(name)) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('lock_timeout', '5s', true);
    EXECUTE format('CREATE TABLE %I (LIKE attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMPRESSION INCLUDING STORAGE)', name);
    EXECUTE format('WITH moved AS (DELETE FROM attempts_default WHERE started_at >= %L AND started_at < %L RETURNING *)
                    INSERT INTO %I SELECT * FROM moved', lo, hi, name);
    EXECUTE format('ALTER TABLE attempts ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name, lo, hi);
    RETURN name;
END
$$;

SELECT railhook_attempt_partition(d::date)
FROM generate_series(
    date_trunc('day', least((SELECT min(started_at) FROM attempts_before_0017), now()) AT TIME ZONE 'UTC'),
    date_trunc('day', now() AT TIME ZONE 'UTC') + interval '7 days',
    interval '1 day') AS d;

INSERT INTO attempts (id, project_id, delivery_id, forward_id, attempt_number, started_at, duration_ms, status_code,
                      result, error_message, response_headers, response_body, response_truncated)
SELECT id, project_id, delivery_id, forward_id, attempt_number, started_at, duration_ms, status_code,
       result, error_message, response_headers, response_body, response_truncated
FROM attempts_before_0017;

DROP TABLE attempts_before_0017;

-- Drops one daily partition of `attempts` (refuses any other table), waiting at most
-- p_lock_timeout for the ACCESS EXCLUSIVE lock the drop takes on `attempts`.
CREATE FUNCTION railhook_attempt_partition_drop(p_name text, p_lock_timeout text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_name !~ '^attempts_p[0-9]{8}$' OR NOT EXISTS (
        SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'attempts'::regclass AND c.relname = p_name) THEN
        RAISE EXCEPTION 'railhook_attempt_partition_drop: % is not a daily partition of attempts', p_name;
    END IF;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    EXECUTE format('DROP TABLE %I', p_name);
END
$$;
