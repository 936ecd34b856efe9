package main

import (
	"fmt"
	"strings"
)

// opt is one parsed option: a short letter ("m") or a long name ("timeout").
type opt struct {
	name string
	arg  string
}

// longOpt is a long option: its name and whether it takes an argument.
type longOpt struct {
	name string
	arg  bool
}

// getopt parses args as glibc's getopt_long(3) does for the short option
// spec short ("m:M:s": a colon marks an option with an argument) and the
// long options long, and returns the options in order and the
// non-option arguments in order:
//
//   - options and non-options may be mixed: the arguments are permuted, so
//     an option after a non-option is still parsed — unless posix is set
//     (glibc's POSIXLY_CORRECT), when the first non-option ends the options;
//   - "--" ends the options (what follows are non-options); "-" alone is a
//     non-option;
//   - short options may be grouped ("-so"); one that takes an argument
//     takes the rest of its word or else the next word, whatever it looks
//     like ("-m -s": -m's argument is "-s");
//   - a long option is "--name", "--name=value" or "--name value" (when it
//     takes an argument), and may be abbreviated to a prefix that names one
//     long option only.
//
// The first error ends parsing; its text is glibc's.
func getopt(args []string, short string, long []longOpt, posix bool) ([]opt, []string, error) {
	var out []opt
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return out, append(rest, args[i+1:]...), nil
		case len(a) < 2 || a[0] != '-':
			if posix {
				return out, append(rest, args[i:]...), nil
			}
			rest = append(rest, a)
		case a[1] == '-':
			lo, val, hasVal, err := matchLong(a, long)
			if err != nil {
				return nil, nil, err
			}
			switch {
			case lo.arg && !hasVal:
				if i+1 >= len(args) {
					return nil, nil, fmt.Errorf("option '--%s' requires an argument", lo.name)
				}
				i++
				val = args[i]
			case !lo.arg && hasVal:
				return nil, nil, fmt.Errorf("option '--%s' doesn't allow an argument", lo.name)
			}
			out = append(out, opt{lo.name, val})
		default:
			for j := 1; j < len(a); j++ {
				c := a[j]
				k := strings.IndexByte(short, c)
				if k < 0 || c == ':' {
					return nil, nil, fmt.Errorf("invalid option -- '%c'", c)
				}
				if k+1 >= len(short) || short[k+1] != ':' {
					out = append(out, opt{string(c), ""})
					continue
				}
				val := a[j+1:]
				if val == "" {
					if i+1 >= len(args) {
						return nil, nil, fmt.Errorf("option requires an argument -- '%c'", c)
					}
					i++
					val = args[i]
				}
				out = append(out, opt{string(c), val})
				break
			}
		}
	}
	return out, rest, nil
}

// matchLong finds the long option an argument "--name[=value]" names: the
// option of that exact name, else the only one the name is a prefix of.
func matchLong(a string, long []longOpt) (lo longOpt, val string, hasVal bool, err error) {
	name, val, hasVal := strings.Cut(a[2:], "=")
	var found []longOpt
	for _, l := range long {
		if l.name == name {
			return l, val, hasVal, nil
		}
		if name != "" && strings.HasPrefix(l.name, name) {
			found = append(found, l)
		}
	}
	switch len(found) {
	case 0:
		return longOpt{}, "", false, fmt.Errorf("unrecognized option '%s'", a)
	case 1:
		return found[0], val, hasVal, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "option '%s' is ambiguous; possibilities:", a)
	for _, l := range found {
		fmt.Fprintf(&b, " '--%s'", l.name)
	}
	return longOpt{}, "", false, fmt.Errorf("%s", b.String())
}
