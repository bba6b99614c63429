package main

import (
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// Without a redis-server the run says what it skipped.
func TestMain(m *testing.M) { os.Exit(testproc.Main(m).Run()) }

func serve(t *testing.T, redisAddr string) *httptest.Server {
	h, closeAll, err := newHandler(redisAddr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Client().CloseIdleConnections(); srv.Close(); closeAll() })
	return srv
}

func status(t *testing.T, srv *httptest.Server, path string, header ...string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestService(t *testing.T) {
	srv := serve(t, "")
	codes := map[int]int{}
	start := time.Now()
	for range 25 {
		codes[status(t, srv, "/hello")]++
	}
	// The bucket (burst 20, 10/s, the real clock) admits 20 at once and
	// one more per 100ms the requests took.
	most := 20 + int(math.Ceil(10*time.Since(start).Seconds()))
	if codes[200] < 20 || codes[200] > most || codes[200]+codes[http.StatusTooManyRequests] != 25 {
		t.Fatalf("statuses %v, want 20 to %d × 200, the rest 429", codes, most)
	}
}

func TestServiceWithRedis(t *testing.T) {
	srv := serve(t, redistest.Start(t).Addr)
	if c := status(t, srv, "/api/x"); c != http.StatusBadRequest {
		t.Fatalf("api without a key: %d, want 400", c)
	}
	if c := status(t, srv, "/api/x", "X-API-Key", "k1"); c != 200 {
		t.Fatalf("api with a key: %d", c)
	}
}
