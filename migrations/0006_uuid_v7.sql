-- Time-ordered UUIDv7 generated inside Postgres, for rows created by set-based statements
-- (one ingest statement creates all of an event's deliveries). Postgres 15 has no uuidv7():
-- take a random v4 UUID, overwrite its first 48 bits with the Unix time in milliseconds, and
-- turn the version nibble from 4 (0100) into 7 (0111).
CREATE FUNCTION railhook_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;
