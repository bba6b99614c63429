package daemon_test

import (
	"encoding/base64"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/testproc"
)

// gossip.members is validated, and needs a program that starts the
// membership; a key file stands for the secret.
func TestMembersConfig(t *testing.T) {
	base := `{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/s","burst":1},"gossip":`
	for _, g := range []string{
		`{"members":{"bind":"127.0.0.1:0"}}`,
		`{"listen":"127.0.0.1:0","peers":["127.0.0.1:9"],"members":{"bind":"127.0.0.1:0"}}`,
		`{"listen":"127.0.0.1:0","members":{"bind":"nonsense"}}`,
		`{"listen":"127.0.0.1:0","members":{"bind":"127.0.0.1:0","seeds":["no port"]}}`,
	} {
		if _, err := daemon.ParseConfig([]byte(base + g + "}")); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v", g, err)
		}
	}
	keys := testproc.WriteFile(t, "keys", base64.StdEncoding.EncodeToString(make([]byte, 32)))
	cfg, err := daemon.ParseConfig([]byte(base + `{"listen":"127.0.0.1:0","key_file":"` + keys + `","members":{"bind":"127.0.0.1:0","seeds":["localhost:7947"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("THROTTLED_SECRET", "")
	if _, err := daemon.New(cfg, nil); !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), "membership") {
		t.Fatalf("gossip.members without a MembershipFunc: %v", err)
	}
	var got [][]byte
	cfg.Gossip.Membership = func(g daemon.Gossip, id string, k [][]byte) (gossip.Membership, io.Closer, error) {
		got = k
		return gossip.NewStaticMembership(gossip.Member{}, "127.0.0.1:9"), io.NopCloser(nil), nil
	}
	srv, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(t.Context())
	if len(got) != 1 || len(got[0]) != 32 {
		t.Fatalf("the membership got %d keys", len(got))
	}
	if p := srv.Node().Peers(); len(p) != 1 || p[0] != "127.0.0.1:9" {
		t.Fatalf("peers %v: want the membership's", p)
	}
}

// CheckSecret refuses gossip without a secret long enough, without
// binding anything; a daemon without gossip needs none.
func TestCheckSecret(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	if err := cfg.CheckSecret(); err != nil {
		t.Fatalf("no gossip: %v", err)
	}
	t.Setenv("THROTTLED_SECRET", "")
	cfg.Gossip = daemon.Gossip{Listen: "127.0.0.1:0", Secret: "short"}
	if err := cfg.CheckSecret(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("a 5-byte secret: %v, want ErrInvalid", err)
	}
	cfg.Gossip.Secret = secret
	if err := cfg.CheckSecret(); err != nil {
		t.Errorf("the tests' secret: %v", err)
	}
}
