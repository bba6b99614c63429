package httpload

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Environment variables of TestHTTPLoad.
const (
	envRun     = "THROTTLE_HTTPLOAD"
	envRequire = "THROTTLE_REQUIRE_WRK"
)

// script makes each of wrk's connections a client that starts a request,
// on average, every HTTPLOAD_GAP_MS milliseconds (exponential gaps,
// counted from the previous start, so that the arrivals stay close to
// Poisson while the answers are quick), and logs every answer to
// HTTPLOAD_OUT.<thread> as "<end µs> <status> <latency µs>". wrk reports
// one latency histogram for every status together, so the latency is
// measured here: each request carries an X-Id that the server echoes, and
// the clock is CLOCK_MONOTONIC through LuaJIT's FFI.
const script = `
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long sec; long nsec; } httpload_ts;
int clock_gettime(int clk, httpload_ts *ts);
]]
local ts = ffi.new("httpload_ts")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.sec) * 1000000 + math.floor(tonumber(ts.nsec) / 1000)
end

local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

local out, gap, seq, sent, last = nil, 0, 0, {}, 0
function init(args)
  gap = tonumber(os.getenv("HTTPLOAD_GAP_MS")) * 1000
  out = assert(io.open(os.getenv("HTTPLOAD_OUT") .. "." .. id, "w"))
  math.randomseed(id)
end

function request()
  seq = seq + 1
  sent[seq] = now()
  return wrk.format(nil, nil, {["X-Id"] = tostring(seq)})
end

function response(status, headers, body)
  local t, n = now(), tonumber(headers["X-Id"])
  if n and sent[n] then
    last = t - sent[n]
    sent[n] = nil
    out:write(t, " ", status, " ", last, "\n")
  end
end

function delay()
  local g = -math.log(1 - math.random()) * gap
  return math.max(0, math.floor((g - last) / 1000))
end
`

// sample is one answer as wrk's script logged it.
type sample struct {
	end, latency time.Duration // end on CLOCK_MONOTONIC
	status       int
}

// wrkBinary returns wrk's path, or skips t (fails it under
// THROTTLE_REQUIRE_WRK=1).
func wrkBinary(t *testing.T) string {
	bin, err := exec.LookPath("wrk")
	if err != nil {
		testproc.Unavailable(t, envRequire, "wrk unavailable: no wrk in PATH (install the wrk package)")
	}
	return bin
}

// runWrk runs wrk against url for d with conns connections, each
// starting a request every gap on average, and returns every answer.
func runWrk(t *testing.T, bin, url string, conns int, gap, d time.Duration) []sample {
	t.Helper()
	dir := t.TempDir()
	lua := filepath.Join(dir, "load.lua")
	if err := os.WriteFile(lua, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-t2", "-c"+strconv.Itoa(conns), "-d"+strconv.Itoa(int(d.Seconds()))+"s",
		"--timeout", "30s", "-s", lua, url)
	cmd.Env = append(os.Environ(), "HTTPLOAD_GAP_MS="+strconv.FormatInt(gap.Milliseconds(), 10),
		"HTTPLOAD_OUT="+filepath.Join(dir, "out"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wrk: %v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "out.*"))
	var all []sample
	for _, f := range files {
		all = append(all, readSamples(t, f)...)
	}
	if len(all) == 0 {
		t.Fatalf("wrk logged no answers (%d files)", len(files))
	}
	return all
}

// readSamples parses one file of the script's log.
func readSamples(t *testing.T, path string) []sample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var all []sample
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var end, status, lat int64
		if _, err := fmt.Sscan(sc.Text(), &end, &status, &lat); err != nil {
			t.Fatalf("%s: %q: %v", path, sc.Text(), err)
		}
		all = append(all, sample{end: time.Duration(end) * time.Microsecond, latency: time.Duration(lat) * time.Microsecond, status: int(status)})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}

// score is what one run measured over its settled span.
type score struct {
	answered, good, denied float64 // a second
	goodput                float64 // good / min(answered, capacity)
	p99                    time.Duration
}

// scoreRun scores the answers that ended from warm after the first
// request started until d after it: those of status 200 within deadline
// are good, and p99 is that of the 200s.
func scoreRun(all []sample, warm, d time.Duration, capacity float64, deadline time.Duration) score {
	t0 := all[0].end - all[0].latency
	for _, s := range all {
		t0 = min(t0, s.end-s.latency)
	}
	span := (d - warm).Seconds()
	var n, good, denied int
	var ok []time.Duration
	for _, s := range all {
		if s.end < t0+warm || s.end > t0+d {
			continue
		}
		n++
		switch {
		case s.status == 200:
			ok = append(ok, s.latency)
			if s.latency <= deadline {
				good++
			}
		case s.status == 429:
			denied++
		}
	}
	sc := score{answered: float64(n) / span, good: float64(good) / span, denied: float64(denied) / span}
	sc.goodput = sc.good / min(sc.answered, capacity)
	if len(ok) > 0 {
		slices.Sort(ok)
		sc.p99 = ok[(len(ok)*99-1)/100]
	}
	return sc
}

// row formats one line of the Markdown table.
func row(name string, load float64, s score) string {
	return fmt.Sprintf("| %s | %g× | %.0f | %.0f | %.0f | %.1f%% | %v |", name, load, s.answered, s.denied, s.good,
		100*s.goodput, s.p99.Round(100*time.Microsecond))
}
