package envoyrls

import (
	"errors"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a /json request's body.
const maxJSONBody = 1 << 20

// Handler serves the reference's HTTP endpoints: POST /json (a
// RateLimitRequest in protobuf's JSON mapping, answered with the
// RateLimitResponse: status 200, 429 when over the limit, 400 for a
// request that does not parse or is refused, 503 when the backend
// fails), /healthcheck ("OK" while healthy() is true, else 500; healthy
// nil means always) and /metrics (writeMetrics).
func (s *Service) Handler(healthy func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", s.serveJSON)
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		if healthy != nil && !healthy() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "OK")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.writeMetrics(w)
	})
	return mux
}

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
	if err != nil || len(body) > maxJSONBody {
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	resp, err := s.decide(r.Context(), &req)
	if err != nil {
		code := http.StatusServiceUnavailable
		if errors.Is(err, ErrBadRequest) {
			code = http.StatusBadRequest
		}
		http.Error(w, http.StatusText(code), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}
