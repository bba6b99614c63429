package keyfile

import (
	"encoding/base64"
	"errors"
	"path/filepath"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/testproc"
)

func TestLoad(t *testing.T) {
	k16, k32 := base64.StdEncoding.EncodeToString(make([]byte, 16)), base64.StdEncoding.EncodeToString(make([]byte, 32))
	keys, err := Load(testproc.WriteFile(t, "keys", "# primary first\n"+k32+"\n\n  "+k16+"  \n"))
	if err != nil || len(keys) != 2 || len(keys[0]) != 32 || len(keys[1]) != 16 {
		t.Fatalf("Load: %d keys, %v", len(keys), err)
	}
	for _, body := range []string{"", "# none\n", "not base64!\n", base64.StdEncoding.EncodeToString(make([]byte, 20)) + "\n"} {
		if _, err := Load(testproc.WriteFile(t, "keys", body)); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("Load(%q): %v", body, err)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("a missing key file: %v", err)
	}
}
