#!/usr/bin/env bash
# What a Lua script costs the server per redis.call: runs `redis-benchmark` (4 connections, so
# the server stays busy and its vCPU awake) against a throwaway server on a free loopback port,
# with scripts shaped like the uncontended acquire (on fresh random keys, so every attempt is
# granted), and prints the server's own time per script from INFO commandstats (usec_per_call
# of EVAL, nested commands included).
#
#   bash scripts/script-cost.sh [redis|valkey] [requests]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kind=${1:-redis}
requests=${2:-100000}
export PATH="$PWD/.tools/bin:$PATH"
case "$kind" in
  redis) server=redis-server ;;
  valkey) server=valkey-server ;;
  *) echo "usage: $0 [redis|valkey] [requests]" >&2; exit 2 ;;
esac
command -v "$server" >/dev/null || { echo "$server not found: run bash scripts/setup.sh" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "redis-benchmark not found: run bash scripts/setup.sh" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
"$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
cli=(redis-cli -p "$port")
for _ in $(seq 50); do "${cli[@]}" PING >/dev/null 2>&1 && break; sleep 0.1; done

# The acquire's keys and arguments: lock, fence, queue, waiters, since; token, lease, waiter TTL.
keys=("{k:__rand_int__}" "{k:__rand_int__}:fence" "{k:__rand_int__}:queue" "{k:__rand_int__}:waiters" "{k:__rand_int__}:since")
args=(tok0123456789abcdef0123456789abcd 30000 0)

# The same without the fair queue: lock, fence, since; token, lease.
narrow_keys=("{k:__rand_int__}" "{k:__rand_int__}:fence" "{k:__rand_int__}:since")
narrow_args=(tok0123456789abcdef0123456789abcd 30000)

# measure NAME SCRIPT [narrow]: the server's time per script, with the acquire's five keys and
# three arguments, or with "narrow" the three keys and two arguments of an acquire without the
# fair queue.
measure() {
  "${cli[@]}" FLUSHALL >/dev/null
  "${cli[@]}" CONFIG RESETSTAT >/dev/null
  if [ "${3:-}" = narrow ]; then
    redis-benchmark -p "$port" -q -c 4 -n "$requests" -r 100000000 EVAL "$2" 3 "${narrow_keys[@]}" "${narrow_args[@]}" >/dev/null
  else
    redis-benchmark -p "$port" -q -c 4 -n "$requests" -r 100000000 EVAL "$2" 5 "${keys[@]}" "${args[@]}" >/dev/null
  fi
  local usec
  usec=$("${cli[@]}" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_eval:.*usec_per_call=\([0-9.]*\).*/\1/p')
  printf '%-34s %7s us per script\n' "$1" "$usec"
}

echo "$("$server" --version | cut -d' ' -f1-3), $requests requests per script, 4 connections"
measure "return 1" "return 1"
measure "1 call: SET NX PX" \
  "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"
measure "2 calls: + INCR fence" \
  "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]); return redis.call('INCR', KEYS[2])"
measure "3 calls: + LINDEX queue" \
  "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]); redis.call('LINDEX', KEYS[3], 0); return redis.call('INCR', KEYS[2])"
measure "4 calls: + SET since (old acquire)" \
  "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET'); redis.call('LINDEX', KEYS[3], 0); redis.call('SET', KEYS[5], '', 'PX', '315360000000'); return {1, redis.call('INCR', KEYS[2])}"
# Since 4 December 2026 the grant marker's old value says whether anybody queues, so an
# uncontended grant reads no queue.
measure "3 calls: the acquire (marker GET)" \
  "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET'); if redis.call('SET', KEYS[5], '', 'PX', '315360000000', 'GET') == 'q' then redis.call('LINDEX', KEYS[3], 0) end; return {1, redis.call('INCR', KEYS[2])}"
measure "3 calls, 3 keys: without the fair queue" \
  "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET'); redis.call('SET', KEYS[3], '', 'PX', '315360000000'); return {1, redis.call('INCR', KEYS[2])}" narrow
