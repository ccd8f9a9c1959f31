-- Replays' pace (issue 17: "replays run at a lower priority than live traffic"). One row, the
-- earliest moment the next Replay batch may run, whichever worker runs it: every batch moves it
-- forward by (Deliveries it made) / `replay.max_deliveries_per_second`, under the runner's
-- advisory lock (railhook_store::locks::REPLAY), so the cap holds for all Replays of all
-- Projects together across every worker process.
CREATE TABLE replay_pace (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    not_before timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO replay_pace DEFAULT VALUES;
