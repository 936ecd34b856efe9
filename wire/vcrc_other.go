//go:build !amd64 || purego

package wire

// vcrcFast leaves everything to the tables where there is no carry-less
// multiply to fold with.
func vcrcFast(c uint16, p []byte) (uint16, []byte) { return c, p }
