package capacity

// Regenerate the wire API code under gen/ from proto/ with
//
//	go generate ./...
//
// in this module's directory. It runs pinned versions of buf and of the
// protoc-gen-go and protoc-gen-connect-go plugins with go run (no protoc
// needed; the first run downloads and builds them).
//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
