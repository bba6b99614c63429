package redislimit_test

import (
	"os"
	"testing"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Without a redis-server the run says what it skipped.
func TestMain(m *testing.M) { os.Exit(testproc.Main(m).Run()) }
