package chromiumtest

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle/internal/testproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testproc.Main(m)) }

func TestDumpDOMAndScreenshot(t *testing.T) {
	b := Find(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><body style="background:#fff"><h1 style="background:#036;color:#fff">static</h1>`+
			`<p id="x"></p><script>document.getElementById("x").textContent = "made by " + "script";</script>`)
	})}
	go srv.Serve(l)
	defer srv.Close()
	url := "http://" + l.Addr().String() + "/"
	dom := b.DumpDOM(t, url)
	if !strings.Contains(dom, "static") || !strings.Contains(dom, "made by script") {
		t.Fatalf("DOM lacks the page's text:\n%s", dom)
	}
	img := b.Screenshot(t, url, 400, 300, "")
	if r := img.Bounds(); r.Dx() != 400 || r.Dy() != 300 {
		t.Fatalf("screenshot is %v", r)
	}
	if n := Colors(img, 3); n < 2 {
		t.Fatal("screenshot is blank")
	}
}
