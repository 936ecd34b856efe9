package verbs

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
)

// Error is the error of a verbs or RDMA CM call, as *net.OpError is
// package net's: the C call it stands for, what the call was about, and
// the errno libibverbs or librdmacm would set. Every error the verbs and
// rdmacm packages return is an *Error, so errors.Is(err, syscall.EINVAL)
// and errors.As(err, &e) work on all of them; the cause stays reachable
// (errors.As(err, &badWR) for a *BadWRError, errors.Is(err,
// context.Canceled) for an ended wait).
type Error struct {
	// Op is the C call, e.g. "ibv_create_qp" or "rdma_join_multicast".
	Op string
	// Obj is what the call was about (a device, an address); may be "".
	Obj string
	// Errno is the errno; never 0.
	Errno syscall.Errno
	// Err is what went wrong; nil when the errno says it all.
	Err error
}

// Error returns "op obj: cause: errno text".
func (e *Error) Error() string {
	s := e.Op
	if e.Obj != "" {
		s += " " + e.Obj
	}
	switch {
	case e.Err == nil:
		return s + ": " + e.Errno.Error()
	case errors.Is(e.Err, e.Errno):
		return s + ": " + e.Err.Error()
	}
	return s + ": " + e.Err.Error() + " (" + e.Errno.Error() + ")"
}

// Unwrap returns the errno and the cause.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Errno}
	}
	return []error{e.Errno, e.Err}
}

// ErrnoOf returns the errno an error carries: its own, or the one the
// standard library's error stands for (a deadline: ETIMEDOUT, a
// cancellation: EINTR, a closed socket or file: EBADF); EIO for an error
// that carries none. It is the one place where a Go error becomes an
// errno.
func ErrnoOf(err error) syscall.Errno {
	var e syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e) && e != 0:
		return e
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return syscall.ETIMEDOUT
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrClosed):
		return syscall.EBADF
	}
	return syscall.EIO
}

// OpError returns err as the *Error of call op about obj: nil for nil; an
// error of the same call is returned as is; any other error becomes the
// cause, and its errno (ErrnoOf) the errno.
func OpError(op, obj string, err error) error {
	if err == nil {
		return nil
	}
	if e, ok := err.(*Error); ok && e.Op == op && e.Obj == obj {
		return err
	}
	return &Error{Op: op, Obj: obj, Errno: ErrnoOf(err), Err: err}
}

// Errorf returns the *Error of call op about obj with an errno and no
// other cause.
func Errorf(op, obj string, errno syscall.Errno) error {
	return &Error{Op: op, Obj: obj, Errno: errno}
}

// wrap is OpError for a call's named error result: defer wrap(&err, op, obj).
func wrap(err *error, op, obj string) {
	if *err != nil {
		*err = OpError(op, obj, *err)
	}
}
