package rules_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/throttlekit/throttle/rules"
)

// Rules from a config service, refreshed every minute, starting from the
// last good document on disk when the service is down at start-up.
func ExampleHTTPSource() {
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		fmt.Fprint(w, `{"default": {"rate": "10/s", "burst": 20}}`)
	}))
	defer svc.Close()
	dir, _ := os.MkdirTemp("", "rules")
	defer os.RemoveAll(dir)

	src := rules.Cached(&rules.HTTPSource{URL: svc.URL}, filepath.Join(dir, "rules.json"))
	l, err := rules.OpenSource(context.Background(), src, 5*time.Second,
		rules.WithErrorFunc(func(err error) {
			fmt.Println("rules rejected, the previous ones stay:", err)
		}))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go l.Follow(ctx, src, time.Minute)

	q, _, _ := l.KeyQuota("alice")
	fmt.Println("version", l.Version(), "burst", q.Limit)
	// Output: version "v1" burst 20
}

// A file replaced atomically by a deployment tool, as a Source: Refresh
// reloads it when its content changed.
func ExampleFileSource() {
	dir, _ := os.MkdirTemp("", "rules")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "rules.json")
	os.WriteFile(path, []byte(`{"default": {"rate": "10/s", "burst": 20}}`), 0o600)

	src := rules.FileSource(path)
	l, err := rules.OpenSource(context.Background(), src, 0)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	os.WriteFile(path+".new", []byte(`{"default": {"rate": "10/s", "burst": 50}}`), 0o600)
	os.Rename(path+".new", path)
	if err := l.Refresh(context.Background(), src, time.Second); err != nil {
		panic(err)
	}
	q, _, _ := l.KeyQuota("alice")
	fmt.Println("burst", q.Limit)
	// Output: burst 50
}
