#!/bin/sh
# Kenning's own role: LOGIN and the owner of the kenning database, nothing more (no
# SUPERUSER, CREATEDB or CREATEROLE): all Kenning needs, migrations included. The official
# postgres image runs this once, when it initialises an empty data volume, as POSTGRES_USER
# (the superuser, which Kenning never uses).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v password="${KENNING_DB_PASSWORD:-kenning}" <<'SQL'
CREATE ROLE kenning LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'password';
CREATE DATABASE kenning OWNER kenning;
SQL
