//go:build rdmacore && cgo

package rdmacore

// #cgo LDFLAGS: -lrdmacm -libverbs
import "C"
