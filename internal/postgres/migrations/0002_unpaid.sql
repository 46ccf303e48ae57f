-- 0002: the grants settlement settled without a payout.

-- One row per grant settled unpaid, keyed by its serial: released at its
-- deadline before its confirm, or matching no grant of its shard
-- (unmatched). A serial is in rain_grants (paid) or here, never both:
-- settlement answers for each serial the one way it was settled.
CREATE TABLE rain_unpaid (
    serial       bigint      PRIMARY KEY,
    pool_id      text        NOT NULL,
    sub_pool     int         NOT NULL,
    user_id      text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    granted_at   timestamptz NOT NULL,
    reason       text        NOT NULL CHECK (reason IN ('released', 'unmatched')),
    settled_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX rain_unpaid_pool_user ON rain_unpaid (pool_id, user_id);
