// Package chromiumtest loads pages in a real headless Chromium for tests:
// the DOM after scripts ran (DumpDOM) and a screenshot (Screenshot), each
// one bounded in time, from a fresh profile in a temporary directory.
//
// Chromium is told to reach nothing but loopback: every other host name
// resolves to nothing, other traffic goes to a closed loopback proxy, and
// background networking (updates, sync, metrics) is off. Pages under test
// must be served on 127.0.0.1.
//
// Find honours two environment variables:
//
//   - THROTTLE_CHROMIUM=path names the browser binary (default: chromium,
//     chromium-browser or google-chrome in PATH);
//   - THROTTLE_REQUIRE_CHROMIUM=1 turns "Chromium is not installed" from a
//     skip into a failure, so that CI cannot silently skip.
package chromiumtest

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Environment variables read by Find.
const (
	EnvBinary  = "THROTTLE_CHROMIUM"
	EnvRequire = "THROTTLE_REQUIRE_CHROMIUM"
)

// Timeout bounds each run of the browser.
const Timeout = 60 * time.Second

// Browser is a headless Chromium binary.
type Browser struct {
	bin string
}

// Find returns the browser, or skips t when none is installed (fails it
// under THROTTLE_REQUIRE_CHROMIUM=1).
func Find(t testing.TB) *Browser {
	t.Helper()
	if bin := os.Getenv(EnvBinary); bin != "" {
		return &Browser{bin: bin}
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if bin, err := exec.LookPath(name); err == nil {
			return &Browser{bin: bin}
		}
	}
	testproc.Unavailable(t, EnvRequire,
		"chromium unavailable: no chromium in PATH (install the chromium package, or set "+EnvBinary+"=path)")
	return nil
}

// args are the flags of every run: headless, a private profile, and no
// traffic beyond loopback.
func args(profile string) []string {
	return []string{
		"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + profile, "--no-first-run", "--no-default-browser-check",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-extensions", "--disable-default-apps", "--disable-domain-reliability",
		"--disable-client-side-phishing-detection", "--metrics-recording-only", "--no-pings",
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
		"--proxy-server=http://127.0.0.1:9", // loopback bypasses the proxy
		"--mute-audio", "--hide-scrollbars",
	}
}

// run runs the browser with extra flags and url, returning its stdout.
func (b *Browser) run(t testing.TB, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, b.bin, append(append(args(filepath.Join(dir, "profile")), extra...), url)...)
	cmd.Env = append(os.Environ(), "HOME="+dir) // Chromium writes caches under HOME
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromiumtest: %s %s: %v (timeout %v)\nstderr:\n%s", b.bin, url, err, Timeout, tail(stderr.Bytes(), 4000))
	}
	return stdout.Bytes()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// DumpDOM loads url and returns the serialized DOM once the page has
// loaded.
func (b *Browser) DumpDOM(t testing.TB, url string) string {
	t.Helper()
	return string(b.run(t, url, "--dump-dom"))
}

// Screenshot loads url in a window of width×height pixels and returns the
// decoded PNG screenshot, which it also leaves in path when path is not
// empty.
func (b *Browser) Screenshot(t testing.TB, url string, width, height int, path string) image.Image {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "screenshot.png")
	}
	b.run(t, url, "--screenshot="+path, fmt.Sprintf("--window-size=%d,%d", width, height))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("chromiumtest: screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("chromiumtest: screenshot %s does not decode: %v", path, err)
	}
	return img
}

// Colors returns how many distinct colours img has, counting at most max
// (max <= 0: all): 1 means a blank image.
func Colors(img image.Image, max int) int {
	seen := map[[4]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c0, c1, c2, c3 := img.At(x, y).RGBA()
			seen[[4]uint32{c0, c1, c2, c3}] = true
			if max > 0 && len(seen) >= max {
				return len(seen)
			}
		}
	}
	return len(seen)
}
