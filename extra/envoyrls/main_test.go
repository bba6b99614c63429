package envoyrls

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle/internal/testproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testproc.Main(m)) }
