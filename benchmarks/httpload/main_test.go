package httpload

import (
	"os"
	"testing"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Without wrk the run says what it skipped.
func TestMain(m *testing.M) { os.Exit(testproc.Main(m).Run()) }
