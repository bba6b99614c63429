package cmdkit

import (
	"bytes"
	"strings"
	"testing"
)

func TestLogger(t *testing.T) {
	var b bytes.Buffer
	log, err := Logger(&b, "warn", true)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	if s := b.String(); strings.Contains(s, "hidden") || !strings.Contains(s, `"msg":"shown","k":1`) {
		t.Fatalf("JSON log %q", s)
	}
	b.Reset()
	if log, err = Logger(&b, "debug", false); err != nil {
		t.Fatal(err)
	}
	log.Debug("d")
	if !strings.Contains(b.String(), "level=DEBUG msg=d") {
		t.Fatalf("text log %q", b.String())
	}
	if _, err := Logger(&b, "loud", false); err == nil {
		t.Fatal("level loud accepted")
	}
}
