package main

import (
	"encoding/json"
	"io"

	"github.com/throttlekit/throttle/distributed/daemon"
)

func printJSON(w io.Writer, cfg daemon.Config) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(cfg)
}
