package testproc

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// skipped counts, per reason, the tests Unavailable skipped in this
// process, in the order the reasons first came.
var skipped struct {
	sync.Mutex
	reasons []string
	count   map[string]int
}

// recordSkip notes that a test is skipped for reason.
func recordSkip(reason string) {
	skipped.Lock()
	defer skipped.Unlock()
	if skipped.count == nil {
		skipped.count = map[string]int{}
	}
	if skipped.count[reason] == 0 {
		skipped.reasons = append(skipped.reasons, reason)
	}
	skipped.count[reason]++
}

// skipLines returns one line per reason tests were skipped for, with how
// many were.
func skipLines() []string {
	skipped.Lock()
	defer skipped.Unlock()
	lines := make([]string, 0, len(skipped.reasons))
	for _, r := range skipped.reasons {
		n := skipped.count[r]
		tests := "tests"
		if n == 1 {
			tests = "test"
		}
		lines = append(lines, fmt.Sprintf("skipped %d %s: %s", n, tests, r))
	}
	return lines
}

// Main wraps the testing.M of a package whose tests need a server
// (redis-server, etcd, Chromium), for its TestMain:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testproc.Main(m)) }
//
// Once the tests have run, a run that skipped some for a missing server
// says so, with each reason and how to make the skip a failure, in its
// normal output: see Notice.
func Main(m *testing.M) interface{ Run() int } { return reporting{m} }

type reporting struct{ m *testing.M }

func (r reporting) Run() int {
	code := r.m.Run()
	for _, line := range skipLines() {
		notice(line, code != 0)
	}
	return code
}

// Notice prints a line, after "throttle: " and the name of the package
// under test, where the person running the tests sees it: on
// standard output, which go test shows with -v, for a failing package and
// when testing the current directory; and, since go test shows nothing of
// a passing package of a list (go test ./... or a module pattern) but its
// "ok" line, also on the controlling terminal when there is one and
// standard output is not it already.
func Notice(format string, args ...any) { notice(fmt.Sprintf(format, args...), false) }

// notice is Notice of a line; failing says that go test will show the
// package's output anyway.
func notice(line string, failing bool) {
	line = "throttle: " + pkgName() + ": " + line
	fmt.Println(line)
	if failing || (flag.Parsed() && testing.Verbose()) || isTerminal(os.Stdout) {
		return
	}
	tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0)
	if err != nil {
		return // no terminal: CI, which sets THROTTLE_REQUIRE_* instead
	}
	defer tty.Close()
	_, _ = io.WriteString(tty, line+"\n")
}

// isTerminal reports whether f is a character device (a terminal), as
// standard output is when go test streams a test's output to it.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// pkgName is the package under test, from the test binary's name
// ("redislimit.test").
func pkgName() string {
	return strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
}
