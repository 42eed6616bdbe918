//go:build tools

// Package tools exists so that the wrapper module has a Go file; the
// binaries are built by hack/plane/build.sh with `go build <cmd packages>`.
package tools
