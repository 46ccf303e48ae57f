-- 0001: the grants settlement delivers, and the accounts of closed pools.

-- One row per grant delivered, keyed by its serial (unique across rain):
-- any number of settle workers insert into it, and a repeat is a no-op.
CREATE TABLE rain_grants (
    serial       bigint      PRIMARY KEY,
    pool_id      text        NOT NULL,
    sub_pool     int         NOT NULL,
    user_id      text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    granted_at   timestamptz NOT NULL,
    settled_at   timestamptz NOT NULL DEFAULT now()
);

-- "Where is my red packet?": a user's grant in a pool.
CREATE INDEX rain_grants_pool_user ON rain_grants (pool_id, user_id);

-- One row per closed pool: its final account, per sub-pool too.
CREATE TABLE rain_pools (
    pool_id         text        PRIMARY KEY,
    preloaded_count bigint      NOT NULL,
    preloaded_cents bigint      NOT NULL,
    confirmed_count bigint      NOT NULL,
    confirmed_cents bigint      NOT NULL,
    unclaimed_count bigint      NOT NULL,
    unclaimed_cents bigint      NOT NULL,
    sub_pools       jsonb       NOT NULL,
    closed_at       timestamptz NOT NULL
);
