// Package keyfile reads the key file of the daemon's gossip.key_file,
// for the daemon and the throttled command that reloads it.
package keyfile

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"os"

	"github.com/throttlekit/throttle"
)

// Load reads a key file: one AES key (16, 24 or 32 bytes) a line in
// standard base64, the primary first; blank lines and lines starting with
// # are skipped. Errors wrap throttle.ErrInvalid.
func Load(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip.key_file: %v", throttle.ErrInvalid, err)
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		t := bytes.TrimSpace(sc.Bytes())
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		k, err := base64.StdEncoding.AppendDecode(nil, t)
		if err != nil || (len(k) != 16 && len(k) != 24 && len(k) != 32) {
			return nil, fmt.Errorf("%w: gossip.key_file %s line %d: not the base64 of a 16, 24 or 32-byte key", throttle.ErrInvalid, path, line)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: gossip.key_file %s: no key", throttle.ErrInvalid, path)
	}
	return keys, nil
}
