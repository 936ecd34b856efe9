// Package registry is the one shape of softrdma's registrations: the
// kinds of device (driver.Register, driver.RegisterAddrOwner), the
// per-device clients (verbs.RegisterClient) and the kernel's CM stack
// (kernelcm.Register). Each registration is named; an empty name, a nil
// value or a name registered twice panics, as database/sql's Register
// does, since two packages claiming one name is a program's bug.
package registry

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
)

// Registry holds named values of one kind, in registration order. Its
// zero value is not usable: use New.
type Registry[T any] struct {
	what  string
	mu    sync.Mutex
	names []string
	vals  []T
}

// New returns an empty registry of what (a word for the panics, e.g.
// "provider").
func New[T any](what string) *Registry[T] { return &Registry[T]{what: what} }

// Register adds v under name. It panics when name is empty, v is nil (a
// nil interface or a nil pointer, map, func, channel or slice), or name
// is registered already.
func (r *Registry[T]) Register(name string, v T) {
	if name == "" {
		panic(fmt.Sprintf("softrdma: Register %s: empty name", r.what))
	}
	if isNil(v) {
		panic(fmt.Sprintf("softrdma: Register %s %q: nil", r.what, name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.Contains(r.names, name) {
		panic(fmt.Sprintf("softrdma: Register %s %q twice", r.what, name))
	}
	r.names = append(r.names, name)
	r.vals = append(r.vals, v)
}

// All returns the values in registration order.
func (r *Registry[T]) All() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.vals)
}

// Names returns the names in registration order.
func (r *Registry[T]) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.names)
}

// Len returns how many values are registered.
func (r *Registry[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.vals)
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
