package registry

import (
	"slices"
	"strings"
	"testing"
)

type thing interface{ ID() int }

type impl struct{ id int }

func (i *impl) ID() int { return i.id }

func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.Contains(s, want) {
			t.Errorf("panic %v, want one saying %q", r, want)
		}
	}()
	f()
}

func TestRegistry(t *testing.T) {
	r := New[thing]("thing")
	r.Register("a", &impl{1})
	r.Register("b", &impl{2})
	if got := r.Names(); !slices.Equal(got, []string{"a", "b"}) || r.Len() != 2 || r.All()[1].ID() != 2 {
		t.Errorf("names %v, len %d", got, r.Len())
	}
	mustPanic(t, `Register thing "a" twice`, func() { r.Register("a", &impl{3}) })
	mustPanic(t, `Register thing "c": nil`, func() { r.Register("c", nil) })
	mustPanic(t, `Register thing "d": nil`, func() { r.Register("d", (*impl)(nil)) })
	mustPanic(t, "Register thing: empty name", func() { r.Register("", &impl{4}) })
	if r.Len() != 2 {
		t.Errorf("refused registrations were kept: %v", r.Names())
	}
}
