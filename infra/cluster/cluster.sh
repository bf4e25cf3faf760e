#!/usr/bin/env bash
# A real three-host cluster on one Linux machine, for `make cluster-up` / `make cluster-down`
# (infra/README.md, "A cluster on one machine"). Needs root, iproute2 (ip netns), util-linux
# (unshare, nsenter, runuser) and PostgreSQL's server binaries.
#
#   head  10.213.77.10  Ray head (no task CPUs), PostgreSQL, `mlflow server` on it, moto's S3 server
#   w1    10.213.77.11  Ray worker (2 CPUs, resources host_w1 and worker_host)
#   w2    10.213.77.12  Ray worker (2 CPUs, resources host_w2 and worker_host)
#   this machine (outside) 10.213.77.1 on the bridge: `ray job submit`, curl
#
# Each host is its own network namespace (a veth on one bridge; private addresses only, no
# route off the bridge, IP forwarding untouched) and its own mount namespace with a private
# /tmp (tmpfs: Ray's session folders, PostgreSQL's data, each host's working folder) and the
# repository mounted read-only. Nothing but the bridge and the read-only installed code is
# shared. Everything lives under $STATE (/run/<name>), removed by `down`, which then checks
# that no namespace, link, process or mount of the cluster is left.
#
# usage: infra/cluster/cluster.sh up|down|status|check-clean|env|exec HOST CMD...|pids HOST NAME|fault WHAT [HOST]
set -euo pipefail

NAME="${HARDPOS_CLUSTER_NAME:-hpc}"
NET="${HARDPOS_CLUSTER_SUBNET:-10.213.77}"   # a /24 of private addresses of this cluster's own
PY="${HARDPOS_CLUSTER_PYTHON:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="$(cd "$(dirname "$PY")/.." 2> /dev/null && pwd || echo "$PY")"
STATE="/run/${NAME}"
BRIDGE="${NAME}-br"
HOSTS=(head w1 w2)
declare -A ADDR=([head]="${NET}.10" [w1]="${NET}.11" [w2]="${NET}.12")
OUTSIDE="${NET}.1"
PG_PASSWORD="${HARDPOS_CLUSTER_PG_PASSWORD:-hardpos-cluster-pg}"
HEAD="${ADDR[head]}"
# What every Ray process (and so every job) sees: the services by the head's address; S3
# credentials from a file on each host (never in a job's runtime_env).
CLUSTER_ENV=(
  "MLFLOW_TRACKING_URI=http://${HEAD}:5000"
  "HARDPOS_S3_ENDPOINT_URL=http://${HEAD}:9000"
  "AWS_SHARED_CREDENTIALS_FILE=/tmp/aws/credentials"
  "AWS_REGION=us-east-1"
  "RAY_AUTH_MODE=disabled"
  # gloo binds the address of the machine's hostname unless told the interface: here (one
  # hostname for all hosts) that is loopback, and the peers' connections are refused.
  "GLOO_SOCKET_IFNAME=eth0"
  "RAY_USAGE_STATS_ENABLED=0"
  "HOME=/tmp/home"
  "PATH=$(dirname "$PY"):/usr/sbin:/usr/bin:/sbin:/bin"
)

say() { echo "cluster: $*" >&2; }
die() { say "error: $*"; exit 1; }

ns() { echo "${NAME}-$1"; }
# Run a command on a host: its network and mount namespaces, the cluster's environment.
on() {
  local host="$1"; shift
  nsenter --net="/run/netns/$(ns "$host")" --mount="${STATE}/${host}.mnt" \
    env -i "${CLUSTER_ENV[@]}" "$@"
}
# ... detached, in its own session, its output in the host's /tmp/logs.
on_bg() {
  local host="$1" log="$2"; shift 2
  on "$host" setsid -f sh -c 'exec "$@" >> "/tmp/logs/$0.log" 2>&1 < /dev/null' "$log" "$@" > /dev/null 2>&1 < /dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...: until CMD succeeds
  local limit="$1" what="$2"; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" > /dev/null 2>&1; do
    (( SECONDS < deadline )) || die "${what} not ready after ${limit} s"
    sleep 1
  done
}

preflight() {
  # Each host mounts a private tmpfs on /tmp, which would hide a repository or venv under it
  # (the hosts would fail to mount them, and PostgreSQL would never come up).
  local path
  for path in "$REPO" "$VENV"; do
    case "$(readlink -f "$path")/" in
      /tmp/*) die "${path} is under /tmp, which every host of the cluster replaces with a private tmpfs: put the repository and its venv outside /tmp" ;;
    esac
  done
  [[ $(id -u) == 0 ]] || die "needs root (network and mount namespaces)"
  for tool in ip nsenter unshare runuser setsid; do
    command -v "$tool" > /dev/null || die "${tool} not found (iproute2 / util-linux)"
  done
  [[ -x "$PY" ]] || die "no Python at ${PY}: run 'make install-dev' first (or set HARDPOS_CLUSTER_PYTHON)"
  PG_BIN="$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1)")" 2>/dev/null || true)"
  [[ -x "${PG_BIN}/postgres" ]] || die "PostgreSQL server binaries not found (Debian: apt-get install postgresql)"
  "$PY" -c "import psycopg" 2> /dev/null || die "psycopg missing in ${PY} (pip install 'hardpos[postgres]')"
}

host_up() {
  local host="$1" n; n="$(ns "$host")"
  ip netns add "$n"
  ip link add "${n}-v" type veth peer name eth0 netns "$n"
  ip link set "${n}-v" master "$BRIDGE" up
  ip -n "$n" addr add "${ADDR[$host]}/24" dev eth0
  ip -n "$n" link set lo up
  ip -n "$n" link set eth0 up
  # A mount namespace kept by a bind mount of its file: private /tmp, read-only repository.
  touch "${STATE}/${host}.mnt"
  unshare --mount="${STATE}/${host}.mnt" --propagation private true
  nsenter --mount="${STATE}/${host}.mnt" sh -ec "
    mount -t tmpfs -o size=6g,mode=1777 ${n}-tmp /tmp
    mount --bind '${REPO}' '${REPO}'
    mount -o remount,bind,ro '${REPO}'
    mount --bind '${VENV}' '${VENV}'
    mount -o remount,bind,ro '${VENV}'
    mkdir -p /tmp/logs /tmp/home /tmp/aws /tmp/work
    printf '[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n' > /tmp/aws/credentials"
}

up() {
  preflight
  [[ ! -e "$STATE" ]] || die "${STATE} exists: the cluster is up (or a failed start left it): run 'down' first"
  mkdir -p "$STATE"
  mount --bind "$STATE" "$STATE" && mount --make-private "$STATE"
  trap 'say "start failed; logs:"; logs_tail; down' ERR
  ip link add "$BRIDGE" type bridge
  ip addr add "${OUTSIDE}/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for host in "${HOSTS[@]}"; do host_up "$host"; done
  say "hosts up: $(for h in "${HOSTS[@]}"; do printf '%s=%s ' "$h" "${ADDR[$h]}"; done)"

  # PostgreSQL on the head (its data in the head's /tmp), password auth on the bridge.
  on head sh -c "mkdir -p /tmp/pg && chown postgres:postgres /tmp/pg && printf '%s\n' '${PG_PASSWORD}' > /tmp/pg/pw && chown postgres /tmp/pg/pw"
  on head runuser -u postgres -- "${PG_BIN}/initdb" -D /tmp/pg/data -U mlflow --pwfile=/tmp/pg/pw \
    -A scram-sha-256 --no-sync -E UTF8 --locale=C > /dev/null
  on head sh -c "echo 'host all all ${NET}.0/24 scram-sha-256' >> /tmp/pg/data/pg_hba.conf; rm /tmp/pg/pw"
  on_bg head postgres runuser -u postgres -- "${PG_BIN}/postgres" -D /tmp/pg/data -p 5432 \
    -c "listen_addresses=127.0.0.1,${HEAD}" -k /tmp/pg -c fsync=off
  wait_for 120 "PostgreSQL" on head "$PY" -c "import psycopg; psycopg.connect('host=127.0.0.1 user=mlflow password=${PG_PASSWORD} dbname=postgres', connect_timeout=2).close()"
  on head "$PY" -c "import psycopg; c = psycopg.connect('host=127.0.0.1 user=mlflow password=${PG_PASSWORD} dbname=postgres', autocommit=True); c.execute('CREATE DATABASE mlflow')"

  # S3 (moto's server) on the head, with the buckets.
  on_bg head s3 "$(dirname "$PY")/moto_server" -H 0.0.0.0 -p 9000
  wait_for 120 "S3" on head "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9000', timeout=2)"
  on head "$PY" -c "
import boto3
s3 = boto3.client('s3', endpoint_url='http://127.0.0.1:9000', region_name='us-east-1')
for b in ('hardpos', 'mlflow'): s3.create_bucket(Bucket=b)"

  # MLflow on PostgreSQL, artifacts proxied to S3 (clients need no S3 keys for MLflow). The
  # S3 endpoint is the head's bridge address, not loopback: MLflow 3 clients download through
  # presigned URLs the server signs for that endpoint, and a worker cannot reach the head's 127.0.0.1.
  on_bg head mlflow env MLFLOW_S3_ENDPOINT_URL=http://${HEAD}:9000 \
    MLFLOW_SERVER_ALLOWED_HOSTS="${HEAD},${HEAD}:*,127.0.0.1,127.0.0.1:*,localhost,localhost:*" \
    "$(dirname "$PY")/mlflow" server \
    --backend-store-uri "postgresql+psycopg://mlflow:${PG_PASSWORD}@127.0.0.1:5432/mlflow" \
    --artifacts-destination s3://mlflow/artifacts --serve-artifacts --host 0.0.0.0 --port 5000 --workers 1

  # Ray: the head takes no tasks (drivers only); one CPU and a host resource per worker.
  on head "$(dirname "$PY")/ray" start --head --node-ip-address "$HEAD" --port 6379 --num-cpus 0 \
    --dashboard-host 0.0.0.0 --dashboard-port 8265 --ray-client-server-port 10001 --temp-dir /tmp/ray \
    --disable-usage-stats > "${STATE}/ray-head.out" 2>&1
  for w in w1 w2; do worker_start "$w"; done
  wait_for 300 "MLflow" "$PY" -c "import urllib.request; urllib.request.urlopen('http://${HEAD}:5000/health', timeout=3)"
  wait_for 120 "Ray (3 nodes)" nodes_alive 3
  trap - ERR
  say "up: Ray http://${HEAD}:8265 (3 nodes), MLflow http://${HEAD}:5000 on PostgreSQL, S3 http://${HEAD}:9000"
}

# A worker host's Ray node (again, after a fault: a new node on the same host and resources).
worker_start() {
  local w="$1"
  on "$w" "$(dirname "$PY")/ray" start --address "${HEAD}:6379" --node-ip-address "${ADDR[$w]}" --num-cpus 2 \
    --resources "{\"host_${w}\": 1, \"worker_host\": 1}" --temp-dir /tmp/ray --disable-usage-stats >> "${STATE}/ray-${w}.out" 2>&1
}

# PIDs of the processes in a host whose command name is $2 (e.g. raylet, postgres).
host_pids() {
  local p
  for p in $(ip netns pids "$(ns "$1")" 2> /dev/null); do
    [[ "$(cat "/proc/${p}/comm" 2> /dev/null)" == "$2" ]] && echo "$p"
  done
  return 0
}

# Faults for `make cluster-test`; each acts on one host of this cluster only.
fault() {
  local what="${1:-}" host="${2:-}"
  case "$what" in
    kill-raylet)  # SIGKILL the host's raylet: the node dies as on a crashed machine
      local pids; pids="$(host_pids "$host" raylet)"
      [[ -n "$pids" ]] || die "no raylet on ${host}"
      kill -KILL $pids; say "killed ${host}'s raylet (${pids//$'\n'/ })" ;;
    link-down|link-up)  # the host's cable: its veth on the bridge
      ip link set "$(ns "$host")-v" "${what#link-}"; say "${host}'s link ${what#link-}" ;;
    restart-node)  # a new Ray node on the host (what a node supervisor does after a crash)
      local pids; pids="$(host_pids "$host" raylet)"
      [[ -z "$pids" ]] || die "${host}'s raylet is still running (${pids//$'\n'/ })"
      worker_start "$host"; say "${host}'s Ray node restarted" ;;
    restart-postgres)  # a fast shutdown (open connections cut), then a start on the same data
      on head runuser -u postgres -- "${PG_BIN}/pg_ctl" -D /tmp/pg/data -m fast -w -t 60 stop > /dev/null
      on_bg head postgres runuser -u postgres -- "${PG_BIN}/postgres" -D /tmp/pg/data -p 5432 \
        -c "listen_addresses=127.0.0.1,${HEAD}" -k /tmp/pg -c fsync=off
      wait_for 120 "PostgreSQL" on head "$PY" -c "import psycopg; psycopg.connect('host=127.0.0.1 user=mlflow password=${PG_PASSWORD} dbname=postgres', connect_timeout=2).close()"
      say "PostgreSQL restarted" ;;
    *) die "fault: kill-raylet HOST | link-down HOST | link-up HOST | restart-node HOST | restart-postgres" ;;
  esac
}

nodes_alive() {  # nodes_alive N: N Ray nodes alive, asked from outside (GCS on the bridge)
  local n
  n="$(RAY_AUTH_MODE=disabled "$(dirname "$PY")/ray" status --address "${HEAD}:6379" 2> /dev/null | grep -c " node_" || true)"
  (( n >= $1 ))
}

logs_tail() {
  for host in "${HOSTS[@]}"; do
    [[ -e "${STATE}/${host}.mnt" ]] || continue
    nsenter --mount="${STATE}/${host}.mnt" sh -c "for f in /tmp/logs/*.log; do [ -f \"\$f\" ] && { echo \"== ${host} \$f\"; tail -5 \"\$f\"; }; done" 2>/dev/null || true
  done
  tail -5 "${STATE}"/ray-*.out 2>/dev/null || true
}

# Every process in a host's network namespace: TERM, then KILL after 10 s.
host_down() {
  local host="$1" n pids; n="$(ns "$host")"
  if ip netns list | grep -qw "$n"; then
    pids="$(ip netns pids "$n" || true)"
    if [[ -n "$pids" ]]; then
      kill -TERM $pids 2> /dev/null || true
      for _ in $(seq 20); do pids="$(ip netns pids "$n" || true)"; [[ -z "$pids" ]] && break; sleep 0.5; done
      [[ -z "$pids" ]] || kill -KILL $pids 2> /dev/null || true
      for _ in $(seq 20); do [[ -z "$(ip netns pids "$n" || true)" ]] && break; sleep 0.5; done
    fi
    ip netns del "$n" || true
  fi
  if [[ -e "${STATE}/${host}.mnt" ]]; then umount "${STATE}/${host}.mnt" 2> /dev/null || true; fi
  ip link del "${n}-v" 2> /dev/null || true
}

down() {
  trap - ERR
  for host in w2 w1 head; do host_down "$host"; done
  ip link del "$BRIDGE" 2> /dev/null || true
  if grep -q " ${STATE} " /proc/mounts; then umount "$STATE" || true; fi
  rm -rf "$STATE"
  check_clean
}

# Nothing of the cluster left: namespaces, links, processes, mounts, state.
check_clean() {
  local left=()
  ip netns list | grep -q "^${NAME}-" && left+=("namespaces: $(ip netns list | grep "^${NAME}-" | tr '\n' ' ')")
  ip -o link show | grep -q " ${NAME}-" && left+=("links: $(ip -o link show | grep -o " ${NAME}-[^:@]*" | tr '\n' ' ')")
  grep -q "${STATE}\|${NAME}-tmp" /proc/mounts && left+=("mounts: $(grep "${STATE}\|${NAME}-tmp" /proc/mounts | cut -d' ' -f2 | tr '\n' ' ')")
  [[ -e "$STATE" ]] && left+=("state folder ${STATE}")
  local procs; procs="$(pgrep -f -- "--temp-dir /tmp/ray|${NET}\.|/tmp/pg/data" || true)"
  [[ -n "$procs" ]] && left+=("processes: ${procs//$'\n'/ }")
  if (( ${#left[@]} )); then say "left behind: ${left[*]}"; return 1; fi
  say "down: nothing left (namespaces, links, processes, mounts)"
}

status() {
  for host in "${HOSTS[@]}"; do
    local n; n="$(ns "$host")"
    if ip netns list | grep -qw "$n"; then
      say "${host} ${ADDR[$host]}: $(ip netns pids "$n" | wc -l) process(es)"
    else
      say "${host}: down"
    fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  check-clean) check_clean ;;
  env) printf 'export RAY_ADDRESS=http://%s:8265 MLFLOW_TRACKING_URI=http://%s:5000 HARDPOS_S3_ENDPOINT_URL=http://%s:9000 RAY_AUTH_MODE=disabled\n' "$HEAD" "$HEAD" "$HEAD" ;;
  exec) shift; host="$1"; shift; on "$host" "$@" ;;
  pids) shift; [[ -n "${ADDR[${1:-}]:-}" && -n "${2:-}" ]] || die "pids HOST NAME (HOST: ${HOSTS[*]})"; host_pids "$1" "$2" ;;
  fault) shift; [[ -e "$STATE" ]] || die "the cluster is not up"; preflight; fault "$@" ;;
  *) echo "usage: $0 up|down|status|check-clean|env|exec HOST CMD...|pids HOST NAME|fault WHAT [HOST]" >&2; exit 2 ;;
esac
