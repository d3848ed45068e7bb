-- leasehold-postgres schema, version 1.
--
-- This is exactly what `PostgresLeaseStore::migrate()` runs (idempotent), written for the default
-- table "public"."leases". For another table, replace the schema prefix `"public".` and the
-- leading `"leases` of every identifier by your own names (migrate() does exactly that, after
-- validating them), or let migrate() run it.
--
-- Objects:
--   "public"."leases"              the lease rows (the seed's columns plus ttl_ms)
--   "public"."leases_token_seq"    the generation floor: every fencing token ever written is <= it
--   "public"."lease_token_floor"() trigger function that draws every new token from the sequence
--   "public"."leases_fence"        the high-water-mark table (fenced resource)

CREATE SEQUENCE IF NOT EXISTS "public"."leases_token_seq" AS bigint MINVALUE 1 START 1;

CREATE TABLE IF NOT EXISTS "public"."leases" (
    resource_key  text        PRIMARY KEY,
    owner         text        NOT NULL,
    lease_until   timestamptz NOT NULL,
    fencing_token bigint      NOT NULL CHECK (fencing_token > 0),
    -- The TTL of the current grant in milliseconds (NULL for rows written by other tools).
    ttl_ms        bigint      CHECK (ttl_ms > 0)
);

-- Tokens never go back: every INSERT, and every UPDATE that changes fencing_token, gets
-- greatest(requested token, nextval(sequence)). The sequence only grows, so a token drawn after a
-- row was deleted is still greater than every token that row ever had. A token written above the
-- sequence (by hand, or by a tool that bypassed this trigger) lifts the sequence to it.
CREATE OR REPLACE FUNCTION "public"."lease_token_floor"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    seq regclass := TG_ARGV[0]::regclass;
    floor_value bigint;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.fencing_token IS NOT DISTINCT FROM OLD.fencing_token THEN
        RETURN NEW; -- renew or release: the generation does not change
    END IF;
    floor_value := nextval(seq);
    IF NEW.fencing_token IS NULL OR NEW.fencing_token <= floor_value THEN
        NEW.fencing_token := floor_value;
    ELSE
        -- Serialise lifts so that two of them cannot move the sequence back.
        PERFORM pg_advisory_xact_lock(1818583411, hashtext(seq::text));
        IF NEW.fencing_token > coalesce(pg_sequence_last_value(seq), 0) THEN
            PERFORM setval(seq, NEW.fencing_token);
        END IF;
    END IF;
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE TRIGGER "leases_token_floor"
    BEFORE INSERT OR UPDATE OF fencing_token ON "public"."leases"
    FOR EACH ROW EXECUTE FUNCTION "public"."lease_token_floor"('"public"."leases_token_seq"');

-- The high-water-mark table: a resource written with a fencing token but without the lease row.
CREATE TABLE IF NOT EXISTS "public"."leases_fence" (
    resource_key       text   PRIMARY KEY,
    last_fencing_token bigint NOT NULL CHECK (last_fencing_token > 0),
    value              bytea,
    counter            bigint NOT NULL DEFAULT 0,
    accepted           bigint NOT NULL DEFAULT 0
);
