#!/usr/bin/env bash
# Start/stop throwaway PostgreSQL and MariaDB servers for the test suite.
#
#   scripts/dbs.sh start DIR   install (if needed), init and start both servers
#                              with data under DIR, on free loopback ports, and
#                              write DIR/env with IDEM_TEST_POSTGRES_DSN and
#                              IDEM_TEST_MYSQL_DSN export lines.
#                              Also a three-node MariaDB Galera cluster
#                              (IDEM_TEST_GALERA_DSNS: three DSNs, comma
#                              separated, node 1 first) unless IDEM_DBS_GALERA=0.
#   scripts/dbs.sh start-galera DIR
#                              only the Galera cluster; DIR/env gets
#                              IDEM_TEST_GALERA_DSNS.
#   scripts/dbs.sh start-redis DIR
#                              only the Redis servers (below); DIR/env gets
#                              their IDEM_TEST_REDIS_* lines (other lines kept).
#                              `start` starts them too unless IDEM_DBS_REDIS=0.
#   scripts/dbs.sh stop DIR    stop every server by pid (idempotent).
#
# Redis (Debian's redis-server and redis-sentinel), every server on free
# loopback ports, without persistence, debug commands allowed from loopback
# (the failover test pauses servers with DEBUG SLEEP):
#   IDEM_TEST_REDIS_ADDR             one server
#   IDEM_TEST_REDIS_CLUSTER_ADDRS    a Redis Cluster of three primaries
#                                    (no replicas), comma separated
#   IDEM_TEST_REDIS_SENTINEL_ADDRS   three sentinels watching a primary and
#                                    one replica, comma separated
#   IDEM_TEST_REDIS_SENTINEL_MASTER  the master name they watch ("idemtest");
#                                    the two replicate as the ACL user repl
#
# Layout of DIR:
#   DIR/env          export lines (source it)
#   DIR/pg.pid       postmaster pid      DIR/pg/      data + server.log (owned by postgres)
#   DIR/mysql.pid    mariadbd pid        DIR/mysql/   data, tmp, server.log, mysql.sock (owned by mysql)
#   DIR/galera/nN/   node N: my.cnf (every setting), data, tmp, server.log, node.pid
#   DIR/redis/NAME/  one Redis server (single, cluster-N, primary, replica,
#                    sentinel-N): redis.conf (every setting), redis.pid, server.log
#
# Galera: wsrep_provider libgalera_smm.so (Debian galera-4), state transfer
# by rsync (so the servers run as the mysql user), binlog_format=ROW,
# innodb_autoinc_lock_mode=2; the first node bootstraps (--wsrep-new-cluster),
# the others join it one after the other. Every port (client, gcomm, IST,
# SST) is a free loopback port.
#
# Servers listen on 127.0.0.1 only. Several DIRs can run at the same time:
# port selection and server start-up are serialised with a machine-wide lock.
# Progress goes to stderr; stdout stays quiet.
set -euo pipefail

PG_USER=postgres            # Postgres superuser (trust auth on loopback)
MY_USER=idem                # MariaDB user
MY_PASS=idem                # MariaDB password
DB_NAME=idem_test
MAX_CONNECTIONS=500
START_TIMEOUT=${IDEM_DBS_START_TIMEOUT:-180}   # seconds per server
STOP_TIMEOUT=${IDEM_DBS_STOP_TIMEOUT:-30}     # seconds per server before SIGKILL
LOCK_FILE=${IDEM_DBS_LOCK_FILE:-/tmp/idem-dbs.lock}
PORT_MIN=20000              # below the kernel's ephemeral range (32768+)
PORT_SPAN=12000

log() { printf 'dbs.sh: %s\n' "$*" >&2; }
die() { printf 'dbs.sh: ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
	echo "usage: $0 start|start-galera|start-redis|stop DIR" >&2
	exit 2
}

now() { date +%s; }

# --------------------------------------------------------------------------
# binaries

pg_bindir() {
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	if [[ -n "$d" && -x "$d/postgres" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
		echo "$d"
	fi
}

my_server_bin() {
	local b
	for b in mariadbd mysqld; do
		if command -v "$b" >/dev/null 2>&1; then command -v "$b"; return; fi
		if [[ -x "/usr/sbin/$b" ]]; then echo "/usr/sbin/$b"; return; fi
	done
}

my_install_db_bin() {
	local b
	for b in mariadb-install-db mysql_install_db; do
		if command -v "$b" >/dev/null 2>&1; then command -v "$b"; return; fi
		if [[ -x "/usr/bin/$b" ]]; then echo "/usr/bin/$b"; return; fi
	done
}

my_client_bin() {
	local b
	for b in mariadb mysql; do
		if command -v "$b" >/dev/null 2>&1; then command -v "$b"; return; fi
	done
}

have_all_binaries() {
	[[ -n "$(pg_bindir)" ]] && command -v psql >/dev/null 2>&1 &&
		[[ -n "$(my_server_bin)" && -n "$(my_install_db_bin)" && -n "$(my_client_bin)" ]]
}

ensure_installed() {
	if have_all_binaries; then
		return
	fi
	[[ $(id -u) -eq 0 ]] || die "PostgreSQL/MariaDB binaries missing and not running as root: install postgresql mariadb-server"
	log "installing postgresql mariadb-server with apt-get (first time only; takes a few minutes)"
	local t0 pkgs=(postgresql mariadb-server)
	t0=$(now)
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y --no-install-recommends "${pkgs[@]}" >/tmp/idem-dbs-apt.log 2>&1; then
		log "apt-get install failed; running apt-get update and retrying"
		apt-get update >>/tmp/idem-dbs-apt.log 2>&1 || { tail -n 30 /tmp/idem-dbs-apt.log >&2; die "apt-get update failed"; }
		apt-get install -y --no-install-recommends "${pkgs[@]}" >>/tmp/idem-dbs-apt.log 2>&1 ||
			{ tail -n 30 /tmp/idem-dbs-apt.log >&2; die "apt-get install ${pkgs[*]} failed (log: /tmp/idem-dbs-apt.log)"; }
	fi
	have_all_binaries || die "binaries still missing after apt-get install (log: /tmp/idem-dbs-apt.log)"
	log "install done in $(($(now) - t0))s"
}

# --------------------------------------------------------------------------
# helpers

# as_user USER CMD... : run CMD as USER (we are root), or directly if not root.
as_user() {
	local u=$1
	shift
	if [[ $(id -u) -eq 0 && "$u" != root ]]; then
		runuser -u "$u" -- "$@"
	else
		"$@"
	fi
}

# Every local TCP port in use (any state, v4 and v6), one per line, decimal.
used_ports() {
	local f
	for f in /proc/net/tcp /proc/net/tcp6; do
		[[ -r $f ]] || continue
		awk 'NR > 1 { split($2, a, ":"); print a[2] }' "$f"
	done | while read -r hex; do echo $((16#$hex)); done | sort -un
}

# Print a loopback TCP port nobody uses. Call with the lock held.
free_port() {
	local used p i
	used=$(used_ports)
	for ((i = 0; i < 200; i++)); do
		p=$((PORT_MIN + (RANDOM * 32768 + RANDOM) % PORT_SPAN))
		if grep -qx "$p" <<<"$used"; then continue; fi
		# Belt and braces: nothing answers on it either.
		if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then continue; fi
		echo "$p"
		return
	done
	die "could not find a free TCP port in $PORT_MIN-$((PORT_MIN + PORT_SPAN))"
}

# Live (non-zombie) pids whose command line contains NEEDLE.
pids_matching() {
	local needle=$1 d pid
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		if pid_is_ours "$pid" "$needle"; then echo "$pid"; fi
	done
}

port_listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Is PID alive (not a zombie) and does its command line mention NEEDLE?
pid_is_ours() {
	local pid=$1 needle=$2 state
	[[ -n "$pid" && "$pid" =~ ^[0-9]+$ && -d /proc/$pid ]] || return 1
	state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)
	[[ "$state" != Z ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$needle"
}

# The dir's parents must let the postgres/mysql users reach DIR.
check_reachable() {
	local u=$1 d=$2
	as_user "$u" test -x "$d" ||
		die "user $u cannot reach $d (a parent directory is not world-executable); use a DIR under /tmp"
}

# close_fds: close every descriptor above 2 of this (sub)shell. Servers
# are started from one that did, so that a daemon keeps no lock open: under
# `flock FILE scripts/dbs.sh start DIR` a server that inherited flock's
# descriptor would hold FILE's lock for as long as it runs.
close_fds() {
	local fd
	for fd in /proc/$BASHPID/fd/*; do
		fd=${fd##*/}
		if ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
	done
}

lock() {
	exec 9>>"$LOCK_FILE"
	chmod 0666 "$LOCK_FILE" 2>/dev/null || true
	flock -w 900 9 || die "timed out waiting for lock $LOCK_FILE"
}
unlock() { flock -u 9 2>/dev/null || true; exec 9>&-; }

tail_log() {
	local f=$1
	if [[ -f "$f" ]]; then
		echo "----- last lines of $f -----" >&2
		tail -n 40 "$f" >&2
		echo "-----" >&2
	fi
}

# --------------------------------------------------------------------------
# PostgreSQL

pg_start() {
	local dir=$1 bindir pgdir data logf port attempt t0 pid
	bindir=$(pg_bindir)
	pgdir="$dir/pg"
	data="$pgdir/data"
	logf="$pgdir/server.log"
	t0=$(now)

	rm -rf "$pgdir"
	mkdir -p "$pgdir"
	chown postgres: "$pgdir"
	chmod 0700 "$pgdir"
	check_reachable postgres "$pgdir"

	log "postgres: initdb ($bindir)"
	(cd / && as_user postgres "$bindir/initdb" -D "$data" -U "$PG_USER" --auth=trust \
		-E UTF8 --no-locale --no-sync >"$dir/pg-initdb.log" 2>&1) ||
		{ tail_log "$dir/pg-initdb.log"; die "postgres initdb failed"; }

	for attempt in 1 2 3 4 5; do
		lock
		port=$(free_port)
		cat >>"$data/postgresql.conf" <<-EOF

			# --- idem test settings (scripts/dbs.sh) ---
			listen_addresses = '127.0.0.1'
			port = $port
			unix_socket_directories = ''
			max_connections = $MAX_CONNECTIONS
			fsync = off
			synchronous_commit = off
			full_page_writes = off
			logging_collector = off
		EOF
		log "postgres: starting on 127.0.0.1:$port (attempt $attempt)"
		if (cd / && close_fds && as_user postgres setsid "$bindir/pg_ctl" -D "$data" -l "$logf" -w -t "$START_TIMEOUT" \
			start </dev/null >"$dir/pg-ctl.log" 2>&1); then
			unlock
			break
		fi
		unlock
		if grep -q 'Address already in use' "$logf" 2>/dev/null; then
			log "postgres: port $port taken, retrying"
			continue
		fi
		tail_log "$dir/pg-ctl.log"
		tail_log "$logf"
		die "postgres did not start within ${START_TIMEOUT}s"
	done
	pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
	pid_is_ours "$pid" "$data" || { tail_log "$logf"; die "postgres did not start (no live postmaster)"; }
	echo "$pid" >"$dir/pg.pid"

	# Wait until it accepts TCP connections, then create the database.
	local deadline=$(($(now) + START_TIMEOUT))
	until "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U "$PG_USER" -d postgres; do
		if (($(now) > deadline)) || ! pid_is_ours "$pid" "$data"; then
			tail_log "$logf"
			die "postgres on port $port did not accept connections within ${START_TIMEOUT}s"
		fi
		sleep 0.2
	done
	"$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U "$PG_USER" -d postgres \
		-c "CREATE DATABASE $DB_NAME" >/dev/null || { tail_log "$logf"; die "postgres: CREATE DATABASE failed"; }
	PG_PORT=$port
	log "postgres: ready on 127.0.0.1:$port pid $pid ($(($(now) - t0))s)"
}

# --------------------------------------------------------------------------
# MariaDB

my_start() {
	local dir=$1 server installdb client mydir data logf initf sock run_as port attempt t0 pid='' launcher
	server=$(my_server_bin)
	installdb=$(my_install_db_bin)
	client=$(my_client_bin)
	mydir="$dir/mysql"
	data="$mydir/data"
	logf="$mydir/server.log"
	initf="$mydir/init.sql"
	t0=$(now)

	run_as=root
	if id mysql >/dev/null 2>&1; then run_as=mysql; fi

	# The socket lives in a dir the server user can write. Unix socket paths
	# are limited to ~107 bytes; fall back to a short dir under /tmp.
	sock="$mydir/mysql.sock"
	if ((${#sock} > 100)); then
		sock="$(mktemp -d /tmp/idem-mysock.XXXXXX)/mysql.sock"
		chmod 0755 "$(dirname "$sock")"
		chown "$run_as" "$(dirname "$sock")"
	fi

	rm -rf "$mydir"
	mkdir -p "$mydir"
	chown "$run_as:" "$mydir" 2>/dev/null || chown "$run_as" "$mydir"
	chmod 0750 "$mydir"
	[[ $run_as == root ]] || check_reachable "$run_as" "$mydir"

	# A private tmpdir: concurrent servers (and install-db runs) sharing /tmp
	# collide on their temp file names.
	mkdir -p "$mydir/tmp"
	chown "$run_as" "$mydir/tmp"
	chmod 0700 "$mydir/tmp"

	log "mariadb: install-db ($installdb)"
	(cd / && "$installdb" --no-defaults --user="$run_as" --datadir="$data" \
		--auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
		--tmpdir="$mydir/tmp" \
		>"$dir/mysql-install-db.log" 2>&1) ||
		{ tail_log "$dir/mysql-install-db.log"; die "mariadb install-db failed"; }

	# Executed by the server at start-up, before clients can log in.
	cat >"$initf" <<-EOF
		CREATE DATABASE IF NOT EXISTS $DB_NAME CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
		CREATE USER IF NOT EXISTS '$MY_USER'@'127.0.0.1' IDENTIFIED BY '$MY_PASS';
		CREATE USER IF NOT EXISTS '$MY_USER'@'::1' IDENTIFIED BY '$MY_PASS';
		CREATE USER IF NOT EXISTS '$MY_USER'@'localhost' IDENTIFIED BY '$MY_PASS';
		GRANT ALL PRIVILEGES ON *.* TO '$MY_USER'@'127.0.0.1' WITH GRANT OPTION;
		GRANT ALL PRIVILEGES ON *.* TO '$MY_USER'@'::1' WITH GRANT OPTION;
		GRANT ALL PRIVILEGES ON *.* TO '$MY_USER'@'localhost' WITH GRANT OPTION;
		FLUSH PRIVILEGES;
	EOF
	chown "$run_as" "$initf"

	for attempt in 1 2 3 4 5; do
		lock
		port=$(free_port)
		log "mariadb: starting on 127.0.0.1:$port (attempt $attempt)"
		rm -f "$sock" "$mydir/mysqld.pid"
		(cd / && close_fds && exec setsid "$server" --no-defaults \
			--user="$run_as" \
			--datadir="$data" \
			--pid-file="$mydir/mysqld.pid" \
			--tmpdir="$mydir/tmp" \
			--socket="$sock" \
			--port="$port" \
			--bind-address=127.0.0.1 \
			--skip-name-resolve \
			--init-file="$initf" \
			--max-connections="$MAX_CONNECTIONS" \
			--character-set-server=utf8mb4 \
			--collation-server=utf8mb4_unicode_ci \
			--default-time-zone=+00:00 \
			--innodb-buffer-pool-size=128M \
			--innodb-flush-log-at-trx-commit=2 \
			--innodb-doublewrite=0 \
			--skip-log-bin \
			--skip-external-locking \
			</dev/null >"$logf" 2>&1) &
		launcher=$!

		local deadline=$(($(now) + START_TIMEOUT)) ok=0 taken=0
		while (($(now) <= deadline)); do
			pid=$(cat "$mydir/mysqld.pid" 2>/dev/null || true)
			if [[ -n "$pid" ]] && port_listening "$port" &&
				"$client" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$port" -u "$MY_USER" -p"$MY_PASS" \
					--connect-timeout=2 -N -e 'SELECT 1' "$DB_NAME" >/dev/null 2>&1; then
				ok=1
				break
			fi
			if grep -qiE 'Address already in use|Do you already have another .* server running on port' "$logf" 2>/dev/null; then
				taken=1
				break
			fi
			# Server died?
			if ! pid_is_ours "$launcher" "$data" && [[ -z "$(pids_matching "--datadir=$data")" ]]; then
				sleep 0.5
				grep -qiE 'Address already in use|another .* server running on port' "$logf" 2>/dev/null && taken=1
				break
			fi
			sleep 0.3
		done
		unlock
		if ((ok)); then break; fi
		# Make sure nothing is left of a failed attempt.
		local p
		for p in $(pids_matching "--datadir=$data"); do kill -KILL "$p" 2>/dev/null || true; done
		if ((taken)); then
			log "mariadb: port $port taken, retrying"
			sleep 1
			continue
		fi
		tail_log "$logf"
		die "mariadb did not come up on 127.0.0.1:$port (exited, or not accepting connections within ${START_TIMEOUT}s)"
	done
	((ok)) || { tail_log "$logf"; die "mariadb: no free port after 5 attempts"; }
	pid_is_ours "$pid" "$data" || { tail_log "$logf"; die "mariadb pid $pid is not our server"; }
	echo "$pid" >"$dir/mysql.pid"
	MY_PORT=$port
	log "mariadb: ready on 127.0.0.1:$port pid $pid ($(($(now) - t0))s)"
}

# --------------------------------------------------------------------------
# MariaDB Galera: three nodes on loopback

GALERA_NODES=3
GALERA_PROVIDER=${IDEM_DBS_GALERA_PROVIDER:-/usr/lib/galera/libgalera_smm.so}

have_galera() {
	[[ -f "$GALERA_PROVIDER" ]] && command -v rsync >/dev/null 2>&1 &&
		command -v wsrep_sst_rsync >/dev/null 2>&1 &&
		{ command -v ss >/dev/null 2>&1 || command -v lsof >/dev/null 2>&1; }
}

ensure_galera_installed() {
	if have_galera; then
		return
	fi
	[[ $(id -u) -eq 0 ]] || die "Galera missing and not running as root: install galera-4 rsync iproute2"
	log "installing galera-4 rsync iproute2 with apt-get (first time only)"
	local pkgs=(galera-4 rsync iproute2)
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y --no-install-recommends "${pkgs[@]}" >>/tmp/idem-dbs-apt.log 2>&1; then
		apt-get update >>/tmp/idem-dbs-apt.log 2>&1 || { tail -n 30 /tmp/idem-dbs-apt.log >&2; die "apt-get update failed"; }
		apt-get install -y --no-install-recommends "${pkgs[@]}" >>/tmp/idem-dbs-apt.log 2>&1 ||
			{ tail -n 30 /tmp/idem-dbs-apt.log >&2; die "apt-get install ${pkgs[*]} failed (log: /tmp/idem-dbs-apt.log)"; }
	fi
	have_galera || die "Galera still missing after apt-get install (log: /tmp/idem-dbs-apt.log)"
}

# my_query PORT SQL: one value from the server on PORT, or nothing.
my_query() {
	"$(my_client_bin)" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$1" -u "$MY_USER" -p"$MY_PASS" \
		--connect-timeout=2 -N -B -e "$2" 2>/dev/null
}

# galera_node_start DIR N: start node N (1 bootstraps the cluster) with the
# ports in GALERA_PORT, GALERA_GCOMM, GALERA_IST, GALERA_SST, and wait until
# it is Synced. Returns 1 (not die) on failure so the caller can retry with
# other ports; 2 when a port was taken.
galera_node_start() {
	local dir=$1 n=$2 server gdir data logf cnf sock initf launcher pid='' t0 peers='' i
	server=$(my_server_bin)
	gdir="$dir/galera/n$n"
	data="$gdir/data"
	logf="$gdir/server.log"
	cnf="$gdir/my.cnf"
	sock="$gdir/mysql.sock"
	initf="$dir/galera/init.sql"
	t0=$(now)
	for ((i = 1; i < n; i++)); do peers+="${peers:+,}127.0.0.1:${GALERA_GCOMM[i]}"; done
	# Every option lives in the node's own file: the rsync state transfer
	# script reads the joiner's and donor's settings from it.
	cat >"$cnf" <<-EOF
		[mysqld]
		user = mysql
		datadir = $data
		pid-file = $gdir/mysqld.pid
		tmpdir = $gdir/tmp
		socket = $sock
		port = ${GALERA_PORT[n]}
		bind-address = 127.0.0.1
		skip-name-resolve
		max-connections = $MAX_CONNECTIONS
		character-set-server = utf8mb4
		collation-server = utf8mb4_unicode_ci
		default-time-zone = +00:00
		innodb-buffer-pool-size = 64M
		innodb-log-file-size = 48M
		innodb-flush-log-at-trx-commit = 2
		innodb-doublewrite = 0
		skip-external-locking
		log-error = $logf
		default-storage-engine = InnoDB
		binlog-format = ROW
		innodb-autoinc-lock-mode = 2
		wsrep-on = ON
		wsrep-provider = $GALERA_PROVIDER
		wsrep-cluster-name = idem-$(basename "$dir")
		wsrep-cluster-address = gcomm://$peers
		wsrep-node-name = n$n
		wsrep-node-address = 127.0.0.1:${GALERA_GCOMM[n]}
		wsrep-node-incoming-address = 127.0.0.1:${GALERA_PORT[n]}
		wsrep-provider-options = "gmcast.listen_addr=tcp://127.0.0.1:${GALERA_GCOMM[n]};ist.recv_addr=127.0.0.1:${GALERA_IST[n]};gcache.size=64M;gcache.page_size=16M;pc.wait_prim_timeout=PT60S"
		wsrep-sst-method = rsync
		wsrep-sst-receive-address = 127.0.0.1:${GALERA_SST[n]}
		wsrep-slave-threads = 2
	EOF
	((n == 1)) && echo "init-file = $initf" >>"$cnf"
	chown mysql "$cnf"
	rm -f "$gdir/mysqld.pid" "$sock"
	local extra=()
	((n == 1)) && extra=(--wsrep-new-cluster)
	log "galera: starting node $n on 127.0.0.1:${GALERA_PORT[n]} (gcomm ${GALERA_GCOMM[n]}, ist ${GALERA_IST[n]}, sst ${GALERA_SST[n]})"
	(cd / && close_fds && exec setsid "$server" --defaults-file="$cnf" "${extra[@]}" </dev/null >>"$logf" 2>&1) &
	launcher=$!
	local deadline=$(($(now) + START_TIMEOUT)) state=''
	while (($(now) <= deadline)); do
		pid=$(cat "$gdir/mysqld.pid" 2>/dev/null || true)
		if [[ -n "$pid" ]] && port_listening "${GALERA_PORT[n]}"; then
			state=$(my_query "${GALERA_PORT[n]}" "SHOW STATUS LIKE 'wsrep_local_state_comment'" | awk '{print $2}')
			if [[ "$state" == Synced ]]; then
				echo "$pid" >"$gdir/node.pid"
				log "galera: node $n synced, pid $pid ($(($(now) - t0))s)"
				return 0
			fi
		fi
		if grep -qiE 'Address already in use|another .* server running on port|Failed to listen|bind: Address' "$logf" 2>/dev/null; then
			return 2
		fi
		if ! pid_is_ours "$launcher" "$cnf" && [[ -z "$(pids_matching "$cnf")" ]]; then
			sleep 0.5
			grep -qiE 'Address already in use|Failed to listen' "$logf" 2>/dev/null && return 2
			return 1
		fi
		sleep 0.5
	done
	return 1
}

# galera_start DIR: a three-node cluster, DSNs in GALERA_DSNS.
galera_start() {
	local dir=$1 installdb gbase t0 attempt n rc i
	installdb=$(my_install_db_bin)
	gbase="$dir/galera"
	t0=$(now)
	id mysql >/dev/null 2>&1 || die "galera: the mysql user is missing (the rsync state transfer runs as mysql)"
	for attempt in 1 2 3; do
		galera_stop "$dir"
		rm -rf "$gbase"
		mkdir -p "$gbase"
		chmod 0755 "$gbase"
		cat >"$gbase/init.sql" <<-EOF
			CREATE DATABASE IF NOT EXISTS $DB_NAME CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
			CREATE USER IF NOT EXISTS '$MY_USER'@'127.0.0.1' IDENTIFIED BY '$MY_PASS';
			CREATE USER IF NOT EXISTS '$MY_USER'@'localhost' IDENTIFIED BY '$MY_PASS';
			GRANT ALL PRIVILEGES ON *.* TO '$MY_USER'@'127.0.0.1' WITH GRANT OPTION;
			GRANT ALL PRIVILEGES ON *.* TO '$MY_USER'@'localhost' WITH GRANT OPTION;
			FLUSH PRIVILEGES;
		EOF
		chown mysql "$gbase/init.sql"
		for ((n = 1; n <= GALERA_NODES; n++)); do
			mkdir -p "$gbase/n$n/tmp"
			chown -R mysql: "$gbase/n$n"
			chmod 0750 "$gbase/n$n"
		done
		check_reachable mysql "$gbase/n1"
		# Only the first node needs system tables: the joiners receive the
		# whole data directory from it by state transfer.
		log "galera: install-db"
		(cd / && "$installdb" --no-defaults --user=mysql --datadir="$gbase/n1/data" \
			--auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
			--tmpdir="$gbase/n1/tmp" >"$gbase/install-db.log" 2>&1) ||
			{ tail_log "$gbase/install-db.log"; die "galera: install-db failed"; }
		for ((n = 2; n <= GALERA_NODES; n++)); do
			mkdir -p "$gbase/n$n/data"
			chown mysql: "$gbase/n$n/data"
		done

		lock
		local used p all=()
		GALERA_PORT=() GALERA_GCOMM=() GALERA_IST=() GALERA_SST=()
		for ((n = 1; n <= GALERA_NODES; n++)); do
			for i in PORT GCOMM IST SST; do
				while :; do
					p=$(free_port)
					if [[ " ${all[*]} " != *" $p "* ]]; then break; fi
				done
				all+=("$p")
				eval "GALERA_$i[$n]=$p"
			done
		done
		rc=0
		for ((n = 1; n <= GALERA_NODES; n++)); do
			galera_node_start "$dir" "$n" || { rc=$?; break; }
		done
		unlock
		if ((rc == 0)); then
			GALERA_DSNS=''
			for ((n = 1; n <= GALERA_NODES; n++)); do
				GALERA_DSNS+="${GALERA_DSNS:+,}$MY_USER:$MY_PASS@tcp(127.0.0.1:${GALERA_PORT[n]})/$DB_NAME?parseTime=true&loc=UTC"
			done
			local size
			size=$(my_query "${GALERA_PORT[1]}" "SHOW STATUS LIKE 'wsrep_cluster_size'" | awk '{print $2}')
			[[ "$size" == "$GALERA_NODES" ]] || die "galera: cluster size is '$size', want $GALERA_NODES"
			log "galera: $GALERA_NODES nodes up in $(($(now) - t0))s"
			return 0
		fi
		if ((rc == 2)); then
			log "galera: a port was taken (node $n), retrying with other ports"
		else
			tail_log "$gbase/n$n/server.log"
			log "galera: node $n did not come up (attempt $attempt)"
		fi
		sleep 1
	done
	galera_stop "$dir"
	die "galera: cluster did not come up after 3 attempts (logs under $gbase)"
}

galera_stop() {
	local dir=$1 n
	for ((n = GALERA_NODES; n >= 1; n--)); do
		stop_pid "galera node $n" "$dir/galera/n$n/node.pid" "$dir/galera/n$n/mysqld.pid" "$dir/galera/n$n/my.cnf" TERM
	done
}

# --------------------------------------------------------------------------
# Redis: one server, a three-primary cluster, a Sentinel group

REDIS_MASTER=idemtest
REDIS_REPL_PASS=idemrepl

have_redis() {
	command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 &&
		command -v redis-sentinel >/dev/null 2>&1
}

ensure_redis_installed() {
	if have_redis; then
		return
	fi
	[[ $(id -u) -eq 0 ]] || die "Redis missing and not running as root: install redis-server redis-sentinel"
	log "installing redis-server redis-sentinel with apt-get (first time only)"
	local pkgs=(redis-server redis-sentinel)
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y --no-install-recommends "${pkgs[@]}" >>/tmp/idem-dbs-apt.log 2>&1; then
		apt-get update >>/tmp/idem-dbs-apt.log 2>&1 || { tail -n 30 /tmp/idem-dbs-apt.log >&2; die "apt-get update failed"; }
		apt-get install -y --no-install-recommends "${pkgs[@]}" >>/tmp/idem-dbs-apt.log 2>&1 ||
			{ tail -n 30 /tmp/idem-dbs-apt.log >&2; die "apt-get install ${pkgs[*]} failed (log: /tmp/idem-dbs-apt.log)"; }
	fi
	have_redis || die "Redis still missing after apt-get install (log: /tmp/idem-dbs-apt.log)"
}

# redis_conf DIR NAME PORT [SETTING...]: write DIR/redis/NAME/redis.conf
# for a server on 127.0.0.1:PORT with the common settings and SETTING
# lines. The process title names the file, which is how stop knows the
# server is ours.
redis_conf() {
	local dir=$1 name=$2 port=$3 sdir
	shift 3
	sdir="$dir/redis/$name"
	mkdir -p "$sdir"
	{
		echo "port $port"
		echo "bind 127.0.0.1"
		echo "dir $sdir"
		echo "pidfile $sdir/redis.pid"
		echo "logfile $sdir/server.log"
		echo "daemonize yes"
		echo 'proc-title-template "{title} {listen-addr} {server-mode} {config-file}"'
		printf '%s\n' "$@"
	} >"$sdir/redis.conf"
}

# redis_launch DIR NAME [--sentinel]: start the server of NAME's
# redis.conf and wait until it answers PING. Returns 2 when its port was
# taken, 1 on any other failure.
redis_launch() {
	local dir=$1 name=$2 mode=${3:-} sdir conf port deadline
	sdir="$dir/redis/$name"
	conf="$sdir/redis.conf"
	port=$(awk '$1 == "port" { print $2 }' "$conf")
	rm -f "$sdir/redis.pid"
	(cd / && close_fds && exec redis-server "$conf" $mode </dev/null >>"$sdir/server.log" 2>&1) || true
	deadline=$(($(now) + START_TIMEOUT))
	until [[ -s "$sdir/redis.pid" ]] && redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; do
		if grep -qiE 'Address already in use|bind: .*in use' "$sdir/server.log" 2>/dev/null; then
			return 2
		fi
		if (($(now) > deadline)); then
			tail_log "$sdir/server.log"
			return 1
		fi
		sleep 0.1
	done
}

# redis_up DIR: every Redis server, ports in REDIS_ADDR, REDIS_CLUSTER_ADDRS
# and REDIS_SENTINEL_ADDRS.
redis_up() {
	local dir=$1 attempt rc n p ports=() all=" " t0
	t0=$(now)
	for attempt in 1 2 3; do
		redis_stop "$dir"
		rm -rf "$dir/redis"
		mkdir -p "$dir/redis"
		lock
		ports=()
		for ((n = 0; n < 10; n++)); do
			while :; do
				p=$(free_port)
				if [[ "$all" != *" $p "* ]]; then break; fi
			done
			all+="$p "
			ports+=("$p")
		done
		# 0 single; 1-3 cluster nodes, 4-6 their bus ports; 7 primary,
		# 8 replica; sentinels on 9 and two more below.
		local common=('save ""' 'appendonly no' 'enable-debug-command local')
		redis_conf "$dir" single "${ports[0]}" "${common[@]}"
		for n in 1 2 3; do
			redis_conf "$dir" "cluster-$n" "${ports[n]}" "${common[@]}" "cluster-enabled yes" \
				"cluster-port ${ports[n + 3]}" "cluster-config-file $dir/redis/cluster-$n/nodes.conf" \
				"cluster-node-timeout 2000"
		done
		# The group's replication runs as the user repl, so that the
		# failover test can cut the replica off (ACL SETUSER repl off)
		# while clients go on.
		local group=("${common[@]}" "user repl on >$REDIS_REPL_PASS ~* &* +@all" "masteruser repl" "masterauth $REDIS_REPL_PASS")
		redis_conf "$dir" primary "${ports[7]}" "${group[@]}"
		redis_conf "$dir" replica "${ports[8]}" "${group[@]}" "replicaof 127.0.0.1 ${ports[7]}"
		rc=0
		for name in single cluster-1 cluster-2 cluster-3 primary replica; do
			redis_launch "$dir" "$name" || { rc=$?; break; }
		done
		REDIS_SENTINEL_ADDRS=''
		if ((rc == 0)); then
			local sp
			for n in 1 2 3; do
				if ((n == 1)); then sp=${ports[9]}; else
					while :; do
						sp=$(free_port)
						if [[ "$all" != *" $sp "* ]]; then break; fi
					done
					all+="$sp "
				fi
				redis_conf "$dir" "sentinel-$n" "$sp" \
					"sentinel monitor $REDIS_MASTER 127.0.0.1 ${ports[7]} 2" \
					"sentinel down-after-milliseconds $REDIS_MASTER 1000" \
					"sentinel failover-timeout $REDIS_MASTER 3000" \
					"sentinel parallel-syncs $REDIS_MASTER 1"
				redis_launch "$dir" "sentinel-$n" --sentinel || { rc=$?; break; }
				REDIS_SENTINEL_ADDRS+="${REDIS_SENTINEL_ADDRS:+,}127.0.0.1:$sp"
			done
		fi
		unlock
		if ((rc == 0)); then break; fi
		if ((rc == 2)); then
			log "redis: a port was taken, retrying with other ports"
			continue
		fi
		redis_stop "$dir"
		die "redis: a server did not start (logs under $dir/redis)"
	done
	((rc == 0)) || { redis_stop "$dir"; die "redis: no free ports after 3 attempts"; }

	REDIS_ADDR="127.0.0.1:${ports[0]}"
	REDIS_CLUSTER_ADDRS="127.0.0.1:${ports[1]},127.0.0.1:${ports[2]},127.0.0.1:${ports[3]}"
	redis-cli --cluster create 127.0.0.1:"${ports[1]}" 127.0.0.1:"${ports[2]}" 127.0.0.1:"${ports[3]}" \
		--cluster-replicas 0 --cluster-yes >"$dir/redis/cluster-create.log" 2>&1 ||
		{ tail_log "$dir/redis/cluster-create.log"; redis_stop "$dir"; die "redis: cluster create failed"; }
	local deadline=$(($(now) + START_TIMEOUT)) ok
	while :; do
		ok=1
		for n in 1 2 3; do
			redis-cli -h 127.0.0.1 -p "${ports[n]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
		done
		if ((ok)); then break; fi
		(($(now) <= deadline)) || { redis_stop "$dir"; die "redis: the cluster did not reach cluster_state:ok"; }
		sleep 0.2
	done
	# The Sentinel group is ready when every sentinel knows the replica and
	# the two other sentinels.
	while :; do
		ok=1
		for p in ${REDIS_SENTINEL_ADDRS//,/ }; do
			p=${p##*:}
			[[ $(redis-cli -h 127.0.0.1 -p "$p" sentinel master "$REDIS_MASTER" 2>/dev/null |
				awk 'prev == "num-slaves" || prev == "num-other-sentinels" { printf "%s ", $0 } { prev = $0 }') == "1 2 " ]] || ok=0
		done
		if ((ok)); then break; fi
		(($(now) <= deadline)) || { redis_stop "$dir"; die "redis: the sentinels did not find the replica and each other"; }
		sleep 0.2
	done
	log "redis: server $REDIS_ADDR, cluster $REDIS_CLUSTER_ADDRS, sentinels $REDIS_SENTINEL_ADDRS ($(($(now) - t0))s)"
}

redis_stop() {
	local dir=$1 conf
	[[ -d "$dir/redis" ]] || return 0
	for conf in "$dir"/redis/*/redis.conf; do
		[[ -f "$conf" ]] || continue
		stop_pid "redis $(basename "$(dirname "$conf")")" "$(dirname "$conf")/redis.pid" "$(dirname "$conf")/redis.pid" "$conf" TERM
	done
}

# redis_env FILE: the export lines of the Redis servers.
redis_env() {
	cat <<-EOF
		export IDEM_TEST_REDIS_ADDR='$REDIS_ADDR'
		export IDEM_TEST_REDIS_CLUSTER_ADDRS='$REDIS_CLUSTER_ADDRS'
		export IDEM_TEST_REDIS_SENTINEL_ADDRS='$REDIS_SENTINEL_ADDRS'
		export IDEM_TEST_REDIS_SENTINEL_MASTER='$REDIS_MASTER'
	EOF
}

# --------------------------------------------------------------------------
# stop

# stop_pid NAME PIDFILE SERVER_PIDFILE NEEDLE SIGNAL
# PIDFILE is ours; SERVER_PIDFILE (the server's own) covers a start that
# failed before PIDFILE was written.
stop_pid() {
	local name=$1 pidfile=$2 srvpidfile=$3 needle=$4 sig=$5 pid=''
	local deadline
	if [[ -f "$pidfile" ]]; then
		pid=$(head -n 1 "$pidfile" 2>/dev/null || true)
	elif [[ -f "$srvpidfile" ]]; then
		pid=$(head -n 1 "$srvpidfile" 2>/dev/null || true)
	fi
	if ! pid_is_ours "$pid" "$needle"; then
		rm -f "$pidfile"
		return 0
	fi
	log "$name: stopping pid $pid"
	kill "-$sig" "$pid" 2>/dev/null || true
	# Keep kids from being left behind if we have to SIGKILL the parent.
	local kids
	kids=$(ps -o pid= --ppid "$pid" 2>/dev/null || true)
	deadline=$(($(now) + STOP_TIMEOUT))
	while pid_is_ours "$pid" "$needle"; do
		if (($(now) > deadline)); then
			log "$name: pid $pid still running after ${STOP_TIMEOUT}s, sending SIGKILL"
			# shellcheck disable=SC2086 # $kids is a list of pids
			kill -KILL "$pid" $kids 2>/dev/null || true
			# Postgres backends exit by themselves once the postmaster is gone.
			sleep 1
			break
		fi
		sleep 0.2
	done
	rm -f "$pidfile"
}

cmd_stop() {
	local dir=$1
	[[ -d "$dir" ]] || return 0
	# Postgres: SIGINT = fast shutdown (does not wait for clients). MariaDB: SIGTERM.
	stop_pid postgres "$dir/pg.pid" "$dir/pg/data/postmaster.pid" "$dir/pg/data" INT
	stop_pid mariadb "$dir/mysql.pid" "$dir/mysql/mysqld.pid" "$dir/mysql/data" TERM
	galera_stop "$dir"
	redis_stop "$dir"
}

cmd_start() {
	local dir=$1 t0
	t0=$(now)
	if pid_is_ours "$(cat "$dir/pg.pid" 2>/dev/null || true)" "$dir/pg/data" &&
		pid_is_ours "$(cat "$dir/mysql.pid" 2>/dev/null || true)" "$dir/mysql/data" &&
		[[ -s "$dir/env" ]] &&
		{ [[ "${IDEM_DBS_REDIS:-1}" != 1 ]] || pid_is_ours "$(cat "$dir/redis/single/redis.pid" 2>/dev/null || true)" "$dir/redis/single/redis.conf"; }; then
		log "servers already running for $dir (see $dir/env)"
		return 0
	fi
	# Anything half-started from an earlier run goes first.
	cmd_stop "$dir"
	rm -f "$dir/env"

	command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"
	lock
	ensure_installed
	unlock

	mkdir -p "$dir"
	chmod 0755 "$dir"

	PG_PORT='' MY_PORT='' GALERA_DSNS='' REDIS_ADDR=''
	# On failure, do not leave a half-started set behind.
	trap 'rc=$?; if ((rc != 0)); then cmd_stop "'"$dir"'" || true; fi' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	pg_start "$dir"
	my_start "$dir"
	if [[ "${IDEM_DBS_GALERA:-1}" == 1 ]]; then
		lock
		ensure_galera_installed
		unlock
		galera_start "$dir"
	fi
	if [[ "${IDEM_DBS_REDIS:-1}" == 1 ]]; then
		lock
		ensure_redis_installed
		unlock
		redis_up "$dir"
	fi
	trap - EXIT INT TERM

	umask 022
	cat >"$dir/env.tmp" <<-EOF
		export IDEM_TEST_POSTGRES_DSN='postgres://$PG_USER@127.0.0.1:$PG_PORT/$DB_NAME?sslmode=disable'
		export IDEM_TEST_MYSQL_DSN='$MY_USER:$MY_PASS@tcp(127.0.0.1:$MY_PORT)/$DB_NAME?parseTime=true&loc=UTC'
	EOF
	if [[ -n "$GALERA_DSNS" ]]; then
		echo "export IDEM_TEST_GALERA_DSNS='$GALERA_DSNS'" >>"$dir/env.tmp"
	fi
	if [[ -n "$REDIS_ADDR" ]]; then
		redis_env >>"$dir/env.tmp"
	fi
	mv "$dir/env.tmp" "$dir/env"
	log "servers up in $(($(now) - t0))s; source $dir/env"
}

# cmd_start_galera DIR: only the Galera cluster (for a test run whose single
# servers come from the environment); DIR/env gets IDEM_TEST_GALERA_DSNS.
cmd_start_galera() {
	local dir=$1
	if [[ -s "$dir/env" ]] && grep -q IDEM_TEST_GALERA_DSNS "$dir/env" &&
		pid_is_ours "$(cat "$dir/galera/n1/node.pid" 2>/dev/null || true)" "$dir/galera/n1/my.cnf"; then
		log "galera already running for $dir (see $dir/env)"
		return 0
	fi
	galera_stop "$dir"
	command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"
	lock
	ensure_installed
	ensure_galera_installed
	unlock
	chmod 0755 "$dir"
	GALERA_DSNS=''
	trap 'rc=$?; if ((rc != 0)); then galera_stop "'"$dir"'" || true; fi' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	galera_start "$dir"
	trap - EXIT INT TERM
	umask 022
	echo "export IDEM_TEST_GALERA_DSNS='$GALERA_DSNS'" >"$dir/env.tmp"
	mv "$dir/env.tmp" "$dir/env"
}

# cmd_start_redis DIR: only the Redis servers; their lines replace any
# IDEM_TEST_REDIS_* lines of DIR/env, the other lines are kept.
cmd_start_redis() {
	local dir=$1
	if [[ -s "$dir/env" ]] && grep -q IDEM_TEST_REDIS_ADDR "$dir/env" &&
		pid_is_ours "$(cat "$dir/redis/single/redis.pid" 2>/dev/null || true)" "$dir/redis/single/redis.conf"; then
		log "redis already running for $dir (see $dir/env)"
		return 0
	fi
	redis_stop "$dir"
	command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"
	lock
	ensure_redis_installed
	unlock
	chmod 0755 "$dir"
	REDIS_ADDR=''
	trap 'rc=$?; if ((rc != 0)); then redis_stop "'"$dir"'" || true; fi' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	redis_up "$dir"
	trap - EXIT INT TERM
	umask 022
	{
		grep -v '^export IDEM_TEST_REDIS_' "$dir/env" 2>/dev/null || true
		redis_env
	} >"$dir/env.tmp"
	mv "$dir/env.tmp" "$dir/env"
}

main() {
	[[ $# -eq 2 ]] || usage
	local cmd=$1 dir=$2
	[[ -n "$dir" ]] || usage
	case "$cmd" in
	start)
		mkdir -p "$dir"
		cmd_start "$(cd "$dir" && pwd -P)"
		;;
	start-galera)
		mkdir -p "$dir"
		cmd_start_galera "$(cd "$dir" && pwd -P)"
		;;
	start-redis)
		mkdir -p "$dir"
		cmd_start_redis "$(cd "$dir" && pwd -P)"
		;;
	stop)
		[[ -d "$dir" ]] || return 0
		cmd_stop "$(cd "$dir" && pwd -P)"
		;;
	*) usage ;;
	esac
}

main "$@"
