package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/testproc"
)

// member is a throttled process in a memberlist cluster on loopback.
type member struct {
	*daemonProc
	gossip, members, admin, keys string
	client                       *client.Client
}

// startMember runs throttled with gossip on a free port, the spend cap,
// rule "k*" at 1/h burst 90 and "r" at 20/s burst 40, memberlist on
// another free port joining seeds, and the keys written to its own key
// file (base64 lines, the primary first).
func startMember(t *testing.T, interval string, seeds []string, keys ...[]byte) *member {
	t.Helper()
	ports, err := testproc.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{gossip: fmt.Sprintf("127.0.0.1:%d", ports[0]), members: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		admin: fmt.Sprintf("127.0.0.1:%d", ports[2]), keys: filepath.Join(t.TempDir(), "keys")}
	m.setKeys(t, keys...)
	seedsJSON := `[]`
	if len(seeds) > 0 {
		seedsJSON = `["` + strings.Join(seeds, `","`) + `"]`
	}
	m.daemonProc = startDaemon(t, fmt.Sprintf(`"rules":[{"pattern":"k*","rate":"1/h","burst":90},{"pattern":"r","rate":"20/s","burst":40}],`+
		`"admin":%q,"gossip":{"listen":%q,"interval":%q,"spend_cap":true,"key_file":%q,"members":{"bind":%q,"seeds":%s,"rejoin":"1s"}}`,
		m.admin, m.gossip, interval, m.keys, m.members, seedsJSON))
	if m.client, err = client.New("tcp", m.tcp, client.WithTimeout(5*time.Second), client.WithPolicy(failsafe.Closed)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.client.Close() })
	return m
}

// setKeys writes the key file; a SIGHUP makes the daemon read it.
func (m *member) setKeys(t *testing.T, keys ...[]byte) {
	t.Helper()
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k) + "\n")
	}
	if err := os.WriteFile(m.keys, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// flood asks for 90 units of a fresh tag, one at a time, and returns how
// many the daemon admitted: with the spend cap, 90 divided by the members
// it shares a fresh key's burst with.
func (m *member) flood(t *testing.T, tag string) int {
	t.Helper()
	tags := make([]string, 90)
	for i := range tags {
		tags[i] = tag
	}
	res := make([]bool, len(tags))
	if err := m.client.CheckMany(context.Background(), tags, res); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ok := range res {
		if ok {
			n++
		}
	}
	return n
}

// waitShare polls m with fresh tags until it admits want of 90 and
// returns how long that took.
func (m *member) waitShare(t *testing.T, want int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	got := 0
	for i := 0; time.Since(start) < within; i++ {
		if got = m.flood(t, fmt.Sprintf("k-%d-%d", time.Now().UnixNano(), i)); got == want {
			return time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s admitted %d of 90 on a fresh tag for %v, want %d", m.tcp, got, within, want)
	return 0
}

// metric reads one sample of the daemon's /metrics.
func (m *member) metric(t *testing.T, sample string) uint64 {
	t.Helper()
	resp, err := http.Get("http://" + m.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("%s: no sample %s", m.admin, sample)
	return 0
}

const unsealed = `throttled_gossip_dropped_total{cause="unsealed"}`

func newKey(t *testing.T) []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

// A daemon killed is out of the spend-cap shares once memberlist declares
// it dead: well before the gossip interval's silence rule (Resend+3 = 4
// intervals of 5 s) would take it out. A daemon started later with a DNS
// name as its seed joins without a restart of the others; being late, it
// decides conservatively (a tag's admissions within the refill since its
// start: none at 1/h) until a peer has sent it every bucket level, which
// takes about four rounds.
func TestMembersKillAndJoin(t *testing.T) {
	key := newKey(t)
	a := startMember(t, "5s", nil, key)
	b := startMember(t, "5s", []string{a.members}, key)
	c := startMember(t, "5s", []string{a.members}, key)
	a.waitShare(t, 30, 10*time.Second)
	c.Kill()
	took := a.waitShare(t, 45, 19*time.Second)
	t.Logf("killed daemon out of the shares after %v", took)
	if took > 15*time.Second {
		t.Errorf("killed daemon left the shares after %v: not memberlist's doing", took)
	}
	_, port, _ := net.SplitHostPort(a.members)
	d := startMember(t, "5s", []string{"localhost:" + port}, key)
	took = a.waitShare(t, 30, 5*time.Second)
	t.Logf("daemon joined by a DNS name after %v", took)
	took = d.waitShare(t, 30, 40*time.Second)
	t.Logf("the daemon that joined late decided normally after %v", took)
	b.waitShare(t, 30, 5*time.Second)
}

// A key rotation under load (each step on every daemon, then a SIGHUP:
// add the new key, make it primary, remove the old one) refuses no
// datagram, and the cluster still admits no more than one bucket; a
// forged datagram, and one sealed under a key the daemons lack, are
// refused and counted.
func TestMembersKeyRotationUnderLoad(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	a := startMember(t, "200ms", nil, k1)
	ms := []*member{a, startMember(t, "200ms", []string{a.members}, k1), startMember(t, "200ms", []string{a.members}, k1)}
	a.waitShare(t, 30, 10*time.Second)

	var mu sync.Mutex
	admitted := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(1)
	go func() { // 60 queries a second, round robin: 3x the rate
		defer wg.Done()
		tick := time.NewTicker(time.Second / 60)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if ok, err := ms[i%3].client.Check(context.Background(), "r"); err == nil && ok {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}
	}()
	step := func(keys ...[]byte) {
		time.Sleep(1500 * time.Millisecond)
		for _, m := range ms {
			m.setKeys(t, keys...)
			m.Signal(syscall.SIGHUP)
		}
	}
	step(k1, k2)
	step(k2, k1)
	step(k2)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	// One bucket: the burst and the rate over the time, plus N-1 (the
	// spend cap's bound) and 2 rounds of slack for the last reports.
	limit := 40 + int(20*elapsed.Seconds()) + 2 + 2*20/5
	t.Logf("admitted %d in %v under a rotation; one bucket allows %d", admitted, elapsed.Round(time.Millisecond), limit)
	if admitted > limit || admitted < limit/2 {
		t.Errorf("admitted %d, one bucket allows %d", admitted, limit)
	}
	for _, m := range ms {
		if n := m.metric(t, unsealed); n != 0 {
			t.Errorf("%s refused %d datagrams during the rotation", m.tcp, n)
		}
	}
	// Forged, and sealed under a key no daemon has.
	udp, err := gossip.ListenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	if err := udp.Send(a.gossip, bytes.Repeat([]byte{1}, 200)); err != nil {
		t.Fatal(err)
	}
	stranger, err := gossip.Seal(udp, staticRing{k1})
	if err != nil {
		t.Fatal(err)
	}
	if err := stranger.Send(a.gossip, bytes.Repeat([]byte{2}, 200)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.metric(t, unsealed) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := a.metric(t, unsealed); n != 2 {
		t.Fatalf("refused %d of 2 datagrams forged or under a removed key", n)
	}
}

// staticRing is a Keyring of one key.
type staticRing struct{ key []byte }

func (r staticRing) GetPrimaryKey() []byte { return r.key }
func (r staticRing) GetKeys() [][]byte     { return [][]byte{r.key} }
