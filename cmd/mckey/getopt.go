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

// getopt parses args like POSIX getopt(3) with the given short option spec
// ("m:M:s" — a colon marks an option with an argument), plus GNU-style long
// options ("--name=value" or "--name value") listed in long (name → takes
// an argument). Parsing stops at "--" or the first non-option.
func getopt(args []string, short string, long map[string]bool) ([]opt, []string, error) {
	var out []opt
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return out, args[i+1:], nil
		}
		if strings.HasPrefix(a, "--") {
			name, val, hasVal := strings.Cut(a[2:], "=")
			takes, ok := long[name]
			if !ok {
				return nil, nil, fmt.Errorf("unrecognized option '--%s'", name)
			}
			if takes && !hasVal {
				if i+1 >= len(args) {
					return nil, nil, fmt.Errorf("option '--%s' requires an argument", name)
				}
				i++
				val = args[i]
			} else if !takes && hasVal {
				return nil, nil, fmt.Errorf("option '--%s' doesn't allow an argument", name)
			}
			out = append(out, opt{name, val})
			continue
		}
		if len(a) < 2 || a[0] != '-' {
			return out, args[i:], nil
		}
		for j := 1; j < len(a); j++ {
			c := a[j]
			k := strings.IndexByte(short, c)
			if k < 0 || c == ':' {
				return nil, nil, fmt.Errorf("invalid option -- '%c'", c)
			}
			if k+1 < len(short) && short[k+1] == ':' {
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
			out = append(out, opt{string(c), ""})
		}
	}
	return out, nil, nil
}
