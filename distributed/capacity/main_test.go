package capacity

import (
	"testing"

	"go.uber.org/goleak"
)

// A connection the HTTP server closed for an oversized request lingers
// for half a second by design before the socket closes.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"))
}
