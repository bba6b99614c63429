package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/throttlekit/throttle/internal/chromiumtest"
)

type grantsResponse struct {
	Grants []struct {
		ResourceID      string  `json:"resourceId"`
		Capacity        float64 `json:"capacity"`
		Lease           string  `json:"lease"`
		RefreshInterval string  `json:"refreshInterval"`
		SafeCapacity    float64 `json:"safeCapacity"`
	} `json:"grants"`
	MasterAddress string `json:"masterAddress"`
	Redirect      bool   `json:"redirect"`
}

// A JSON GetCapacity call through the real listener: while learning, a
// new master confirms what a client says it holds, within capacity.
func TestGetCapacityJSON(t *testing.T) {
	a := startTest(t, testConfig)
	var r grantsResponse
	code := a.call(t, "GetCapacity", `{"clientId":"c1","resources":[
		{"resourceId":"db.writes","wants":80,"has":80},{"resourceId":"cache","wants":5,"has":5}]}`, &r)
	if code != 200 || len(r.Grants) != 2 || r.Redirect || r.MasterAddress != a.apiLn.Addr().String() {
		t.Fatalf("%d %+v", code, r)
	}
	if g := r.Grants[0]; g.ResourceID != "db.writes" || g.Capacity != 50 || g.Lease != "2s" {
		t.Fatalf("db.writes grant %+v, want capacity 50 (all there is) for 2s", g)
	}
	if g := r.Grants[1]; g.ResourceID != "cache" || g.Capacity != 5 {
		t.Fatalf("cache grant %+v", g)
	}
	// A bad resource is refused on its own with a clear code, and counted.
	var e struct {
		Grants []struct{ Code, Error string }
	}
	if code := a.call(t, "GetCapacity", `{"clientId":"c1","resources":[{"resourceId":"db.writes","wants":-1}]}`, &e); code != 200 || len(e.Grants) != 1 || e.Grants[0].Code != "RESOURCE_CODE_INVALID_ARGUMENT" || !strings.Contains(e.Grants[0].Error, "wants must be finite") {
		t.Fatalf("negative wants: %d %+v", code, e)
	}
	var bad struct{ Code, Message string }
	if code := a.call(t, "GetCapacity", `{"clientId":"","resources":[{"resourceId":"db.writes","wants":1}]}`, &bad); code != 400 || bad.Code != "invalid_argument" || !strings.Contains(bad.Message, "client id") {
		t.Fatalf("no client id: %d %+v", code, bad)
	}
	if code := a.call(t, "GetCapacity", `{"clientId":`, nil); code != 400 {
		t.Fatalf("malformed JSON: %d", code)
	}
	_, m := a.get(t, a.adminURL()+"/metrics")
	for _, want := range []string{
		`capacityd_requests_total{method="GetCapacity"} 3`,
		`capacityd_request_errors_total{code="invalid_argument",method="GetCapacity"} 1`,
		`capacityd_refusals_total{reason="invalid_argument"} 1`,
		`capacityd_request_duration_seconds_count{method="GetCapacity"} 3`,
		`capacityd_resource_granted{resource="db.writes"} 50`,
		`capacityd_resource_wants{resource="db.writes"} 80`,
		`capacityd_resource_capacity{resource="db.writes"} 50`,
		`capacityd_resource_learning{resource="db.writes"} 1`,
		`capacityd_template_clients{template="*"} 1`,
		`capacityd_template_resources{template="*"} 1`,
		`capacityd_master 1`,
		`capacityd_term 1`,
		`capacityd_reloads_total{result="refused"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(m)
	}
}

func TestHealthz(t *testing.T) {
	a := startTest(t, testConfig)
	code, body := a.get(t, a.adminURL()+"/healthz")
	if code != 200 || body != "ok master "+a.apiLn.Addr().String()+" term 1\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	a.stopping.Store(true) // as during shutdown
	if code, body := a.get(t, a.adminURL()+"/healthz"); code != 503 || body != "stopping\n" {
		t.Fatalf("/healthz while stopping: %d %q", code, body)
	}
	a.stopping.Store(false)
}

func templateCapacity(a *testApp, id string) float64 {
	for _, tm := range a.cur.Load().resources.Resources {
		if tm.ID == id {
			return tm.Capacity
		}
	}
	return -1
}

// A changed file is reloaded: a valid one applies, an invalid one, or one
// that changes the listen address, is refused with an error log and the
// running configuration stays. SIGHUP reloads too.
func TestReload(t *testing.T) {
	a := startTest(t, testConfig)
	// Each version replaces the file whole (written beside it, then
	// renamed), as configuration tools do: written in place, a watcher
	// tick on a loaded machine could read it truncated and refuse that
	// too, one refusal more than the counts below expect.
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(a.path+".new", []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(a.path+".new", a.path); err != nil {
			t.Fatal(err)
		}
	}
	reloads := func(result string) string {
		_, m := a.get(t, a.adminURL()+"/metrics")
		return regexp.MustCompile(`capacityd_reloads_total\{result="` + result + `"\} (\d+)`).FindStringSubmatch(m)[1]
	}
	write(strings.Replace(testConfig, `"capacity": 50`, `"capacity": 30`, 1))
	eventually(t, "valid file applied", func() bool { return templateCapacity(a, "db.writes") == 30 })
	var r grantsResponse
	a.call(t, "GetCapacity", `{"clientId":"c1","resources":[{"resourceId":"db.writes","wants":80,"has":80}]}`, &r)
	if r.Grants[0].Capacity != 30 {
		t.Fatalf("after reload granted %v, want 30", r.Grants[0].Capacity)
	}

	write(strings.Replace(testConfig, `"capacity": 50`, `"capacity": -5`, 1))
	eventually(t, "invalid file refused", func() bool { return reloads("refused") == "1" })
	if !strings.Contains(a.logs.String(), "configuration refused, keeping the running one") || !strings.Contains(a.logs.String(), "capacity must be finite and >= 0") {
		t.Fatalf("no error log for the invalid file:\n%s", a.logs.String())
	}
	write(`{"listen": "127.0.0.1:1", "resources": [{"id": "*", "capacity": 1}]}`)
	eventually(t, "restart-only change refused", func() bool { return reloads("refused") == "2" })
	if !strings.Contains(a.logs.String(), "changes listen, which needs a restart") {
		t.Fatalf("no error log for the listen change:\n%s", a.logs.String())
	}
	if c := templateCapacity(a, "db.writes"); c != 30 {
		t.Fatalf("refused files changed the configuration: capacity %v", c)
	}

	// SIGHUP rereads even unchanged contents.
	a.sigs <- syscall.SIGHUP
	eventually(t, "SIGHUP reload", func() bool { return reloads("refused") == "3" })
	write(strings.Replace(testConfig, `"capacity": 50`, `"capacity": 40`, 1))
	eventually(t, "valid file applied again", func() bool { return templateCapacity(a, "db.writes") == 40 })
	if got := reloads("applied"); got != "2" {
		t.Fatalf("applied reloads %s, want 2", got)
	}
}

// /status lists resources, clients and their leases, in a real browser.
func TestStatusPageInChromium(t *testing.T) {
	b := chromiumtest.Find(t)
	// Leases long enough to outlast a browser's start on a busy machine.
	a := startTest(t, strings.ReplaceAll(strings.ReplaceAll(testConfig, `"2s"`, `"60s"`), `"500ms"`, `"15s"`))
	for _, c := range []string{"client-alpha", "client-beta"} {
		a.call(t, "GetCapacity", `{"clientId":"`+c+`","resources":[{"resourceId":"db.writes","wants":20,"has":20},
			{"resourceId":"queue.jobs","wants":3,"has":3}]}`, nil)
	}
	// Ids come from clients: the page shows them as text, never markup.
	// (A resource id with a slash matches no "*" template.)
	a.call(t, "GetCapacity", `{"clientId":"<i id=evil>x</i>","resources":[{"resourceId":"<b id=evil2>r<b>","wants":1}]}`, nil)
	url := a.adminURL() + "/status"
	dom := b.DumpDOM(t, url)
	if strings.Contains(dom, `id="evil`) || !strings.Contains(dom, "&lt;i id=evil&gt;x&lt;/i&gt;") || !strings.Contains(dom, "&lt;b id=evil2&gt;r&lt;b&gt;") {
		t.Errorf("client-supplied ids became markup")
	}
	for _, want := range []string{"db.writes", "queue.jobs", "client-alpha", "client-beta", "master", "proportional_share",
		`<td class="id">client-beta</td><td>20</td><td>20</td>`} {
		if !strings.Contains(dom, want) {
			t.Errorf("DOM lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatal(dom)
	}
	img := b.Screenshot(t, url, 1024, 768, "")
	if r := img.Bounds(); r.Dx() != 1024 || r.Dy() != 768 {
		t.Fatalf("screenshot %v", r)
	}
	if n := chromiumtest.Colors(img, 3); n < 3 {
		t.Fatalf("screenshot has %d colour(s): blank", n)
	}
}

// leafGets asks leaf for 50 of "db" as client c1 until it is granted
// want, the root's capacity.
func leafGets(t *testing.T, leaf *testApp, want float64) {
	t.Helper()
	var got float64
	eventually(t, "the leaf's client gets the root's capacity", func() bool {
		var r grantsResponse
		if leaf.call(t, "GetCapacity", `{"clientId":"c1","resources":[{"resourceId":"db","wants":50,"has":`+fmt.Sprint(got)+`}]}`, &r) != 200 || len(r.Grants) != 1 {
			return false
		}
		got = r.Grants[0].Capacity
		return got == want
	})
}

// TestTree: a leaf capacityd with a parent leases its capacity from the
// root capacityd over the wire and divides it: a client of the leaf gets
// capacity once both have learned, never more than the root's.
func TestTree(t *testing.T) {
	root := startTest(t, `{"listen": "127.0.0.1:0", "decrease_grace": "1s", "resources": [
		{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	leaf := startTest(t, `{"listen": "127.0.0.1:0", "parent": ["`+root.apiLn.Addr().String()+`"], "resources": [
		{"id": "*", "capacity": 1000, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	leafGets(t, leaf, 30)
	var r grantsResponse
	if root.call(t, "GetCapacity", `{"clientId":"other","resources":[{"resourceId":"db","wants":50}]}`, &r); r.Grants[0].Capacity != 0 {
		t.Fatalf("the root granted %v more while its child holds all 30", r.Grants[0].Capacity)
	}
}
