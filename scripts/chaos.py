#!/usr/bin/env python3
"""scripts/chaos.py - the chaos and soak driver behind scripts/chaos (python3, stdlib only).

Starts its own loopback cluster from the build's executables (tandem-router, tandem-prefill,
tandem-decode: the command lines `tandem local` uses, one process each so that any one can be
killed and restarted), replays agent sessions rebuilt from the bundled Mooncake trace slice
(bench/traces: hash-id prefix chains, lengths scaled down, tool pauses between turns) through the
OpenAI API, and meanwhile injects faults at seeded random moments: kill -9 and SIGSTOP/SIGCONT of
the prefill node, a decode node (while a stream is running) and the router; a killed process is
restarted with the same flags. Afterwards it checks the contract (docs/RELIABILITY.md, "Chaos"):

  - every session's next turn succeeds;
  - no request hangs past its deadline, and no stream ends without [DONE] or an error event while
    the router stays up (a "lost" request);
  - no process dies of itself (only the ones the suite killed), no sanitizer report in any log;
  - on every decode node the pages return: after the load stops, no reservation is left and every
    page is free or held by a resident session (leaked = total - free - session pages);
  - temperature-0 probe requests (new sessions, short and long prompts) give the same text after
    recovery as in the fault-free run at the start.

--soak instead holds N idle SSE connections (streaming requests whose client reads nothing) open
beside live agent traffic: every live request must be served or refused with a clean HTTP error
before its deadline; the fd count and RSS of every process are printed before, while held and
after, and their growth must stay bounded.

Prints a summary (scenarios run, kills survived, requests lost, pages leaked) and exits 1 on any
violation, 2 on a usage or start-up error. Same seed, same fault schedule.
"""
import argparse
import http.client
import json
import os
import random
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

T0 = [time.monotonic()]  # the start of the fault window (times in reports count from it)
MODEL_NAME = ["tandem"]  # the served model name: the model folder's name (set in main)

WORDS = ("alpha beta gamma delta kernel page token queue router decode prefill session cache "
         "fence abort retry stream buffer socket thread memory layer tensor vector matrix agent "
         "tool patch build test commit branch merge file line error value index").split()

# ---- processes ----------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """One cluster process: its flags, its log, kill/stop/cont/restart by PID."""

    def __init__(self, role, argv, http_port, log_dir, name):
        self.role = role
        self.argv = argv
        self.http_port = http_port
        self.name = name
        self.log_path = os.path.join(log_dir, name + ".log")
        self.p = None
        self.killed_by_us = False
        self.starts = 0
        self.unexpected_exits = []

    def start(self):
        log = open(self.log_path, "ab")
        log.write(("---- start %d: %s\n" % (self.starts + 1, " ".join(self.argv))).encode())
        log.flush()
        self.p = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        log.close()
        self.starts += 1
        self.killed_by_us = False

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def check_exit(self):
        """Note an exit the suite did not cause (a crash); True when the process is gone."""
        if self.p is None:
            return True
        rc = self.p.poll()
        if rc is None:
            return False
        if not self.killed_by_us:
            self.unexpected_exits.append(rc)
            self.killed_by_us = True  # noted once
        return True

    def signal(self, sig):
        if self.alive():
            if sig == signal.SIGKILL:
                self.killed_by_us = True
            os.kill(self.p.pid, sig)

    def kill9(self):
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        if self.p is not None:
            self.p.wait()

    def stop(self, grace_s=8.0):
        if self.p is None or not self.alive():
            return
        self.killed_by_us = True
        os.kill(self.p.pid, signal.SIGCONT)
        os.kill(self.p.pid, signal.SIGTERM)
        try:
            self.p.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait()

    def fds(self):
        try:
            return len(os.listdir("/proc/%d/fd" % self.p.pid))
        except OSError:
            return -1

    def rss_kib(self):
        try:
            with open("/proc/%d/status" % self.p.pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return -1


def http_get(port, path, timeout=2.0):
    """(status, body) or (-1, '') when nothing answers."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read().decode("utf-8", "replace")
        c.close()
        return r.status, body
    except (OSError, http.client.HTTPException):
        return -1, ""


def metrics(port):
    st, body = http_get(port, "/metrics")
    out = {}
    if st != 200:
        return None
    for line in body.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(2) is None:
            try:
                out[m.group(1)] = float(m.group(3))
            except ValueError:
                pass
    return out


class Cluster:
    def __init__(self, args, log_dir):
        b = os.path.join(args.build_dir, "bin")
        self.http_port = free_port()
        self.control = "tcp://127.0.0.1:%d" % free_port()
        common = ["--log-level", args.log_level]
        self.router = Proc("router", [
            os.path.join(b, "tandem-router"), "--model", args.model, "--http",
            "127.0.0.1:%d" % self.http_port, "--control", self.control,
            "--local-prefill-tokens", str(args.local_prefill_tokens),
            "--reservation-timeout-ms", str(args.reservation_timeout_ms),
            "--request-timeout-ms", str(args.request_timeout_ms),
            "--prefill-timeout-ms", str(args.prefill_timeout_ms),
            "--max-connections", str(args.max_connections)] + common,
            self.http_port, log_dir, "router")
        self.workers = []
        for i in range(args.decode + args.prefill):
            role = "decode" if i < args.decode else "prefill"
            port = free_port()
            idx = i if role == "decode" else i - args.decode
            self.workers.append(Proc(role, [
                os.path.join(b, "tandem-" + role), "--model", args.model, "--router",
                self.control, "--http", "127.0.0.1:%d" % port, "--threads", "1", "--pages",
                str(args.pages)] + common, port, log_dir, "%s%d" % (role, idx)))

    def procs(self):
        return [self.router] + self.workers

    def start(self):
        self.router.start()
        if not wait_until(lambda: http_get(self.http_port, "/health")[0] > 0, 60):
            return False
        for w in self.workers:
            w.start()
        return self.wait_healthy(120)

    def wait_healthy(self, timeout_s):
        def ok():
            return all(http_get(p.http_port, "/health")[0] == 200 for p in self.procs())
        return wait_until(ok, timeout_s)

    def stop(self):
        for p in reversed(self.procs()):
            p.stop()


def wait_until(pred, timeout_s, step=0.1):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()

# ---- requests -----------------------------------------------------------------------------------


class Result:
    __slots__ = ("status", "text", "n_tokens", "finish", "done", "error", "hung", "seconds",
                 "conn_lost", "why")

    def __init__(self):
        self.status = -1
        self.text = ""
        self.n_tokens = 0
        self.finish = None
        self.done = False
        self.error = None
        self.hung = False
        self.conn_lost = False
        self.why = ""
        self.seconds = 0.0


def chat(port, messages, session, max_tokens, temperature, seed, deadline_s, on_token=None):
    """One streaming chat request. Never raises; a Result says how it ended."""
    r = Result()
    t0 = time.monotonic()
    body = json.dumps({"model": MODEL_NAME[0], "messages": messages, "max_tokens": max_tokens,
                       "temperature": temperature, "seed": seed, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if session is not None:
        headers["X-Session-Id"] = session
    c = None
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline_s)
        c.request("POST", "/v1/chat/completions", body, headers)
        resp = c.getresponse()
        r.status = resp.status
        if resp.status != 200:
            try:
                err = json.loads(resp.read().decode("utf-8", "replace")).get("error", {})
                r.error = "%s (%s)" % (err.get("type", "http_%d" % resp.status),
                                       str(err.get("message", ""))[:160])
            except ValueError:
                r.error = "http_%d_unparsed" % resp.status
            return r
        while True:
            if time.monotonic() - t0 > deadline_s:
                r.hung = True
                break
            line = resp.readline()
            if not line:
                r.conn_lost = not r.done and r.error is None
                r.why = "end of stream"
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                r.done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                r.error = "%s (%s)" % (ev["error"].get("type") or ev["error"].get("code") or
                                       "error", str(ev["error"].get("message", ""))[:160])
                continue
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    r.text += piece
                    if on_token:
                        on_token()
                if ch.get("finish_reason"):
                    r.finish = ch["finish_reason"]
            if ev.get("usage"):
                r.n_tokens = ev["usage"].get("completion_tokens", 0)
    except socket.timeout:
        r.hung = True
    except (OSError, http.client.HTTPException, ValueError) as e:
        r.conn_lost = True
        r.why = type(e).__name__
    finally:
        if c is not None:
            c.close()
        r.seconds = time.monotonic() - t0
    return r


def ok(r):
    return r.status == 200 and r.done and r.error is None and r.finish is not None

# ---- the agent replay ---------------------------------------------------------------------------


def trace_sessions(path):
    """Sessions of the Mooncake slice rebuilt from hash-id prefix chains (bench/replay/trace.h):
    a request continues the session whose last request's hash ids are its longest prefix."""
    sessions = []
    last = []  # (hash tuple, session index)
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            h = tuple(rec["hash_ids"])
            best, best_len = None, 0
            for lh, si in last:
                if len(lh) > best_len and h[:len(lh)] == lh:
                    best, best_len = si, len(lh)
            if best is None:
                sessions.append([])
                best = len(sessions) - 1
                last.append((h, best))
            else:
                for k, (lh, si) in enumerate(last):
                    if si == best:
                        last[k] = (h, best)
            sessions[best].append(rec)
    return sessions


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = 0
        self.ok = 0
        self.refused = 0  # clean HTTP errors or error events
        self.lost = 0  # stream cut without [DONE]/error while the router was up
        self.cut_by_router_kill = 0
        self.hung = 0
        self.details = []
        self.streaming = 0  # requests that received a token and have not ended
        self.refusals = {}  # "status error (message)" -> count

    def note(self, r, router_epoch_changed, what):
        with self.lock:
            self.sent += 1
            if r.hung:
                self.hung += 1
                self.details.append("hung: %s after %.1f s" % (what, r.seconds))
            elif ok(r):
                self.ok += 1
            elif r.conn_lost or (r.status == 200 and not r.done and r.error is None):
                if router_epoch_changed:
                    self.cut_by_router_kill += 1
                else:
                    self.lost += 1
                    self.details.append("lost: %s (status %d, %d chars, no [DONE], no error: %s)"
                                        % (what, r.status, len(r.text), r.why))
            else:
                self.refused += 1
                key = "%d %s" % (r.status, re.sub(r"[0-9]+", "N", r.error or "no error"))
                self.refusals[key] = self.refusals.get(key, 0) + 1


class Agents:
    """N agent threads replaying trace sessions: each turn is the whole history plus a new user
    message, a streamed answer, then a tool pause. A failed turn is retried (as an agent does)."""

    def __init__(self, args, cluster, stats, rng_seed, router_epoch):
        self.args = args
        self.cluster = cluster
        self.stats = stats
        self.stop = threading.Event()
        self.sessions = {}  # id -> messages
        self.lock = threading.Lock()
        self.router_epoch = router_epoch
        all_sessions = trace_sessions(args.trace)
        rng = random.Random(rng_seed)
        self.plan = [all_sessions[i % len(all_sessions)] for i in range(args.agents * 8)]
        self.threads = [threading.Thread(target=self.run, args=(k, random.Random(rng.random())),
                                         daemon=True) for k in range(args.agents)]

    def words(self, rng, n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def run(self, k, rng):
        a = self.args
        j = k
        while not self.stop.is_set():
            recs = self.plan[j % len(self.plan)]
            j += a.agents
            sid = "chaos-%d-%d-%d" % (a.seed, k, j)
            msgs = [{"role": "system", "content": "You are agent %d. " % k + self.words(rng, 8)}]
            prev_in = 0
            prev_ts = recs[0]["timestamp"]
            for turn, rec in enumerate(recs[:a.max_turns]):
                if self.stop.is_set():
                    break
                grow = max(4, int((rec["input_length"] - prev_in) * a.scale))
                prev_in = rec["input_length"] + rec["output_length"]
                msgs.append({"role": "user", "content": self.words(rng, min(grow, a.max_words))})
                max_tokens = max(4, min(a.max_tokens, int(rec["output_length"] * a.scale)))
                temp = 0.0 if rng.random() < 0.5 else 0.8
                for attempt in range(4):
                    epoch = self.router_epoch[0]
                    t_start = time.monotonic() - T0[0]
                    got = []  # a token arrived: the stream is running (decode faults wait)

                    def first_token():
                        if not got:
                            got.append(1)
                            with self.stats.lock:
                                self.stats.streaming += 1
                    r = chat(self.cluster.http_port, msgs, sid, max_tokens, temp,
                             rng.randrange(1 << 31), a.deadline_s, on_token=first_token)
                    if got:
                        with self.stats.lock:
                            self.stats.streaming -= 1
                    # odd epoch: the router is down (killed, not yet healthy again)
                    self.stats.note(r, epoch != self.router_epoch[0] or epoch % 2 == 1,
                                    "session %s turn %d attempt %d, sent at +%.1f s"
                                    % (sid, turn, attempt + 1, t_start))
                    if ok(r) or self.stop.is_set():
                        break
                    time.sleep(0.3 + rng.random())
                msgs.append({"role": "assistant", "content": r.text if ok(r) else "(no answer)"})
                with self.lock:
                    self.sessions[sid] = list(msgs)
                gap = (rec["timestamp"] - prev_ts) / 1000.0 * a.pause_scale
                prev_ts = rec["timestamp"]
                self.stop.wait(min(gap, a.max_pause) + rng.random() * 0.2)

    def start(self):
        for t in self.threads:
            t.start()

    def join(self, timeout_s):
        self.stop.set()
        end = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.1, end - time.monotonic()))
        return all(not t.is_alive() for t in self.threads)

# ---- checks -------------------------------------------------------------------------------------


PROBES = [
    ("short", 6),  # prefilled on the decode node
    ("long", 90),  # past --local-prefill-tokens: a prefill node's job
    ("mid", 30),
]


def run_probes(args, port, tag):
    """Temperature-0 requests in new sessions; their text must not depend on faults."""
    rng = random.Random(4242)
    out = {}
    for name, n in PROBES:
        msgs = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(n))}]
        r = chat(port, msgs, "probe-%s-%s" % (tag, name), 12, 0.0, 7, args.deadline_s)
        out[name] = r.text if ok(r) else None
    return out


def page_report(cluster, settle_s):
    """Per decode node (name, total, free, session pages, reserved, leaked) after the nodes
    settle (no reservation, nothing running), or with what they hold at the deadline."""
    rows = []
    for w in cluster.workers:
        if w.role != "decode":
            continue
        m = None

        def settled():
            nonlocal m
            m = metrics(w.http_port)
            return m is not None and m.get("tandem_decode_reserved_pages", 1) == 0 and \
                m.get("tandem_decode_running_sequences", 1) == 0 and \
                m.get("tandem_decode_pending_prefills", 1) == 0
        wait_until(settled, settle_s, 0.25)
        if m is None:
            rows.append((w.name, -1, -1, -1, -1, -1))
            continue
        total = int(m.get("tandem_decode_total_pages", 0))
        free = int(m.get("tandem_decode_free_pages", 0))
        # a page shared by k sessions counts k times in session_pages (issue 17)
        held = int(m.get("tandem_decode_session_pages", 0)) - \
            int(m.get("tandem_decode_shared_page_refs", 0))
        resv = int(m.get("tandem_decode_reserved_pages", 0))
        rows.append((w.name, total, free, held, resv, max(0, total - free - held)))
    return rows


def sanitizer_reports(cluster):
    bad = []
    for p in cluster.procs():
        try:
            with open(p.log_path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        for pat in ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer"):
            if pat in text:
                bad.append("%s: %s (log %s)" % (p.name, pat, p.log_path))
    return bad

# ---- chaos --------------------------------------------------------------------------------------


def chaos(args, log_dir):
    rng = random.Random(args.seed)
    cluster = Cluster(args, log_dir)
    violations = []
    print("chaos: seed %d, %d s of faults, logs in %s" % (args.seed, args.seconds, log_dir))
    if not cluster.start():
        cluster.stop()
        print("chaos: the cluster did not start (logs in %s)" % log_dir, file=sys.stderr)
        return 2
    try:
        base = run_probes(args, cluster.http_port, "before")
        if any(v is None for v in base.values()):
            violations.append("fault-free probes failed: %s" % base)
        router_epoch = [0]
        stats = Stats()
        agents = Agents(args, cluster, stats, args.seed, router_epoch)
        agents.start()
        time.sleep(min(3.0, args.seconds / 4))
        scenarios = []
        T0[0] = time.monotonic()
        end = T0[0] + args.seconds
        kinds = ["kill-prefill", "stop-prefill", "kill-decode", "stop-decode", "kill-router",
                 "stop-router"]
        order = []
        while time.monotonic() < end:
            if not order:  # every kind once per round, in a seeded order
                order = kinds[:]
                rng.shuffle(order)
            kind = order.pop()
            role = kind.split("-")[1]
            cands = [p for p in cluster.procs() if p.role == role]
            if not cands:
                continue
            p = cands[rng.randrange(len(cands))]
            delay = rng.uniform(0.0, args.fault_gap_s)
            pause = rng.uniform(0.3, args.max_stop_s)
            down = rng.uniform(0.1, 1.5)
            time.sleep(delay)
            if role == "decode":  # mid-stream: wait (bounded) for a running stream
                wait_until(lambda: stats.streaming > 0, 3.0, 0.02)
            t_fault = time.monotonic()
            if kind.startswith("kill"):
                if role == "router":
                    router_epoch[0] += 1  # odd: down
                p.kill9()
                time.sleep(down)
                p.start()
            else:
                p.signal(signal.SIGSTOP)
                time.sleep(pause)
                p.signal(signal.SIGCONT)
            healthy = cluster.wait_healthy(args.recover_s)
            if router_epoch[0] % 2 == 1:
                router_epoch[0] += 1  # even: up again
            scenarios.append((kind, p.name, round(t_fault - T0[0], 1), healthy))
            print("chaos: %-13s %-9s at +%5.1f s -> %s" % (kind, p.name, scenarios[-1][2],
                                                          "recovered" if healthy else
                                                          "NOT healthy within %d s" %
                                                          args.recover_s), flush=True)
            for q in cluster.procs():
                if q.check_exit() and q.unexpected_exits:
                    violations.append("%s exited by itself (status %s); restarted"
                                      % (q.name, q.unexpected_exits))
                    q.unexpected_exits = []
                    q.start()
                    cluster.wait_healthy(args.recover_s)
            if not healthy:
                violations.append("%s on %s: not healthy within %d s" % (kind, p.name,
                                                                        args.recover_s))
        drained = agents.join(args.deadline_s + 5)
        if not drained:
            violations.append("agents still waiting %d s after the end" % (args.deadline_s + 5))
        cluster.wait_healthy(args.recover_s)
        # the nodes settle: leases of requests the router gave up on lapse (reservation +
        # prefill timeout), running turns end; then every session's next turn
        t_settle = time.monotonic()
        page_report(cluster, args.settle_s)
        print("chaos: faults over at +%.1f s; the decode nodes settled in %.1f s"
              % (time.monotonic() - T0[0], time.monotonic() - t_settle), flush=True)
        with agents.lock:
            sessions = dict(agents.sessions)
        next_fail = []
        for sid, msgs in sorted(sessions.items()):
            msgs = msgs + [{"role": "user", "content": "next turn after the faults"}]
            r = chat(cluster.http_port, msgs, sid, 8, 0.0, 1, args.deadline_s)
            stats.note(r, False, "session %s next turn after the faults" % sid)
            if not ok(r):
                saved = os.path.join(args.out, "failed-next-turn-%s.json" % sid)
                with open(saved, "w") as f:  # the request, to replay by hand
                    json.dump({"X-Session-Id": sid, "messages": msgs}, f)
                next_fail.append("%s: status %d error %s done %s hung %s (request: %s)" % (
                    sid, r.status, r.error, r.done, r.hung, saved))
        after = run_probes(args, cluster.http_port, "after")
        mismatch = [k for k in base if base[k] != after[k]]
        pages = page_report(cluster, args.settle_s)
        leaked = sum(max(0, row[5]) for row in pages)
        kills = [s for s in scenarios if s[0].startswith("kill")]
        survived = [s for s in kills if s[3]]
        print()
        print("chaos summary (seed %d)" % args.seed)
        print("  scenarios run:      %d (%s)" % (len(scenarios), ", ".join(
            "%s x%d" % (k, sum(1 for s in scenarios if s[0] == k)) for k in kinds)))
        print("  kills survived:     %d of %d" % (len(survived), len(kills)))
        print("  requests:           %d sent, %d ok, %d refused cleanly, %d cut by a router kill"
              % (stats.sent, stats.ok, stats.refused, stats.cut_by_router_kill))
        for key, n in sorted(stats.refusals.items(), key=lambda kv: -kv[1])[:8]:
            print("    refused x%d: %s" % (n, key))
        print("  requests lost:      %d" % stats.lost)
        print("  requests hung:      %d (deadline %d s)" % (stats.hung, args.deadline_s))
        print("  sessions next turn: %d of %d ok" % (len(sessions) - len(next_fail),
                                                    len(sessions)))
        print("  probes (temp 0):    %s" % ("equal to the fault-free run" if not mismatch else
                                           "DIFFER: %s" % mismatch))
        for row in pages:
            print("  pages %-9s       total %d free %d session %d reserved %d leaked %d" % row)
        print("  pages leaked:       %d" % leaked)
        for d in stats.details[:20]:
            print("    " + d)
        if stats.lost:
            violations.append("%d requests lost" % stats.lost)
        if stats.hung:
            violations.append("%d requests hung past their deadline" % stats.hung)
        violations += ["next turn failed: " + s for s in next_fail]
        if mismatch:
            violations.append("temperature-0 probes differ after recovery: %s vs %s"
                              % ({k: base[k] for k in mismatch}, {k: after[k] for k in mismatch}))
        if leaked:
            violations.append("%d pages leaked" % leaked)
        for row in pages:
            if row[4] > 0:
                violations.append("%s keeps %d pages reserved after the load" % (row[0], row[4]))
    finally:
        for q in cluster.procs():
            if q.check_exit() and q.unexpected_exits:
                violations.append("%s exited by itself (status %s)" % (q.name,
                                                                     q.unexpected_exits))
        cluster.stop()
    violations += sanitizer_reports(cluster)
    return report(violations)


def report(violations):
    if violations:
        print("chaos: FAILED, %d violation(s):" % len(violations))
        for v in violations:
            print("  - " + v)
        return 1
    print("chaos: passed")
    return 0

# ---- soak ---------------------------------------------------------------------------------------


def open_idle_streams(port, n, max_tokens):
    """n sockets, each with a streaming request sent and nothing read. Returns the sockets."""
    body = json.dumps({"model": MODEL_NAME[0], "messages": [{"role": "user", "content": "idle"}],
                       "max_tokens": max_tokens, "stream": True}).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(req)
        except OSError:
            s.close()
            continue
        socks.append(s)
    return socks


def idle_outcomes(socks):
    """How the idle streams stand: (open, closed by the server, refused with an HTTP error)."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    open_n = closed = refused = 0
    kinds = {}
    ready = {key.fileobj for key, _ in sel.select(0.5)}
    for s in socks:
        if s not in ready:
            open_n += 1
            continue
        try:
            head = s.recv(64, socket.MSG_PEEK)
        except OSError as e:
            head = b""
            kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
        if not head:
            closed += 1
            continue
        line = head.split(b"\r\n")[0].decode("latin-1")
        kinds[line] = kinds.get(line, 0) + 1
        if line.split(" ")[1:2] == ["200"]:
            open_n += 1
        else:
            refused += 1
    sel.close()
    return open_n, closed, refused, kinds


def soak(args, log_dir):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.soak_connections + 256
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
        except (ValueError, OSError):
            pass
    args.max_connections = max(args.max_connections, args.soak_connections + 1024)
    # a sanitizer build keeps up to 256 MiB of freed memory in quarantine: RSS growth would
    # measure that, not the process; keep it small here (it still catches use after free)
    os.environ["ASAN_OPTIONS"] = "quarantine_size_mb=16:thread_local_quarantine_size_kb=64" + (
        ":" + os.environ["ASAN_OPTIONS"] if os.environ.get("ASAN_OPTIONS") else "")
    cluster = Cluster(args, log_dir)
    violations = []
    print("soak: %d idle SSE connections for %d s, seed %d, logs in %s"
          % (args.soak_connections, args.seconds, args.seed, log_dir))
    if not cluster.start():
        cluster.stop()
        print("soak: the cluster did not start (logs in %s)" % log_dir, file=sys.stderr)
        return 2
    socks = []
    try:
        def usage(tag):
            return {p.name: (p.fds(), p.rss_kib()) for p in cluster.procs()}
        warm = chat(cluster.http_port, [{"role": "user", "content": "warm up"}], None, 4, 0.0, 1,
                    args.deadline_s)
        if not ok(warm):
            violations.append("warm-up request failed")
        base = usage("base")
        stats = Stats()
        agents = Agents(args, cluster, stats, args.seed, [0])
        socks = open_idle_streams(cluster.http_port, args.soak_connections, args.soak_max_tokens)
        agents.start()
        time.sleep(args.seconds)
        held = usage("held")
        open_n, closed, refused, kinds = idle_outcomes(socks)
        drained = agents.join(args.deadline_s + 5)
        for s in socks:
            s.close()
        socks = []
        time.sleep(2.0)
        probe = chat(cluster.http_port, [{"role": "user", "content": "after the soak"}], None, 4,
                     0.0, 1, args.deadline_s)
        after = usage("after")
        print()
        print("soak summary (seed %d)" % args.seed)
        print("  idle SSE connections: %d asked, %d opened: %d held open, %d closed by the "
              "server, %d refused with an HTTP error" % (args.soak_connections, open_n + closed +
                                                        refused, open_n, closed, refused))
        print("  idle answers:         %s" % ", ".join("%s x%d" % kv for kv in sorted(kinds.items())))
        print("  live requests:        %d sent, %d ok, %d refused cleanly, %d lost, %d hung"
              % (stats.sent, stats.ok, stats.refused, stats.lost, stats.hung))
        print("  %-9s %8s %8s %8s %10s %10s %10s" % ("process", "fd base", "fd held", "fd after",
                                                    "RSS base", "RSS held", "RSS after"))
        for p in cluster.procs():
            b, h, a = base[p.name], held[p.name], after[p.name]
            print("  %-9s %8d %8d %8d %8d k %8d k %8d k" % (p.name, b[0], h[0], a[0], b[1], h[1],
                                                           a[1]))
            if a[0] > b[0] + args.fd_slack:
                violations.append("%s: %d fds after the soak, %d before" % (p.name, a[0], b[0]))
            if h[0] > b[0] + args.soak_connections + args.fd_slack:
                violations.append("%s: %d fds held for %d connections" % (p.name, h[0],
                                                                          args.soak_connections))
            if a[1] > b[1] + args.rss_slack_mib * 1024:
                violations.append("%s: RSS grew from %d to %d KiB" % (p.name, b[1], a[1]))
        if stats.lost or stats.hung:
            violations.append("live requests: %d lost, %d hung" % (stats.lost, stats.hung))
        for d in stats.details[:20]:
            print("    " + d)
        if not drained:
            violations.append("live agents still waiting after the soak")
        if not ok(probe):
            violations.append("a request after the soak failed (status %d, error %s)"
                              % (probe.status, probe.error))
    finally:
        for s in socks:
            s.close()
        for q in cluster.procs():
            if q.check_exit() and q.unexpected_exits:
                violations.append("%s exited by itself (status %s)" % (q.name,
                                                                     q.unexpected_exits))
        cluster.stop()
    violations += sanitizer_reports(cluster)
    return report(violations)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seconds", nargs="?", type=int, default=60, help="fault (or soak) window")
    ap.add_argument("--soak", action="store_true", help="the soak instead of faults")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("TANDEM_CHAOS_SEED", "1")))
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="log folder")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--pages", type=int, default=512)
    ap.add_argument("--local-prefill-tokens", type=int, default=64)
    ap.add_argument("--reservation-timeout-ms", type=int, default=3000)
    ap.add_argument("--prefill-timeout-ms", type=int, default=15000)
    ap.add_argument("--request-timeout-ms", type=int, default=30000)
    ap.add_argument("--max-connections", type=int, default=1024)
    ap.add_argument("--deadline-s", type=int, default=45, help="client deadline of a request")
    ap.add_argument("--recover-s", type=int, default=30)
    ap.add_argument("--settle-s", type=int, default=25,
                    help="wait this long at most for the decode nodes to settle")
    ap.add_argument("--fault-gap-s", type=float, default=2.0)
    ap.add_argument("--max-stop-s", type=float, default=2.5)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--pause-scale", type=float, default=0.01)
    ap.add_argument("--max-pause", type=float, default=1.0)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--max-words", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--soak-connections", type=int, default=2048)
    ap.add_argument("--soak-max-tokens", type=int, default=4)
    ap.add_argument("--fd-slack", type=int, default=64)
    ap.add_argument("--rss-slack-mib", type=int, default=256)
    ap.add_argument("--log-level", default="info", help="of every process (logs in --out)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    MODEL_NAME[0] = os.path.basename(os.path.normpath(args.model))
    return soak(args, args.out) if args.soak else chaos(args, args.out)


if __name__ == "__main__":
    sys.exit(main())
