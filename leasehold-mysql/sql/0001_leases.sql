CREATE TABLE IF NOT EXISTS `leases` (resource_key  VARBINARY(255) NOT NULL PRIMARY KEY, owner         VARBINARY(255) NOT NULL, lease_until   DATETIME(6)    NOT NULL, fencing_token BIGINT         NOT NULL, ttl_ms        BIGINT         NULL, CONSTRAINT leases_token_positive CHECK (fencing_token > 0)) ENGINE=InnoDB COMMENT='leasehold-mysql lease table v1';

CREATE TABLE IF NOT EXISTS `leases_floor` (resource_key VARBINARY(255) NOT NULL PRIMARY KEY, floor_token  BIGINT         NOT NULL) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS `leases_fence` (resource_key       VARBINARY(255) NOT NULL PRIMARY KEY, last_fencing_token BIGINT         NOT NULL, value              LONGBLOB       NULL, counter            BIGINT         NOT NULL DEFAULT 0, accepted           BIGINT         NOT NULL DEFAULT 0) ENGINE=InnoDB;

CREATE TRIGGER IF NOT EXISTS `leases_token_floor` BEFORE INSERT ON `leases` FOR EACH ROW SET NEW.fencing_token = GREATEST(NEW.fencing_token, COALESCE((SELECT f.floor_token + 1 FROM `leases_floor` f WHERE f.resource_key = NEW.resource_key), 1));

CREATE TRIGGER IF NOT EXISTS `leases_token_rise` BEFORE UPDATE ON `leases` FOR EACH ROW SET NEW.fencing_token = IF(NEW.fencing_token = OLD.fencing_token, OLD.fencing_token, GREATEST(NEW.fencing_token, OLD.fencing_token + 1));

CREATE TRIGGER IF NOT EXISTS `leases_token_keep` AFTER DELETE ON `leases` FOR EACH ROW INSERT INTO `leases_floor` (resource_key, floor_token) VALUES (OLD.resource_key, OLD.fencing_token) ON DUPLICATE KEY UPDATE floor_token = GREATEST(floor_token, OLD.fencing_token);
