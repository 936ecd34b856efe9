package main

import (
	"reflect"
	"testing"
)

// TestGetopt: getopt parses mckey's option string as glibc's getopt_long:
// it permutes (options after non-options are parsed, non-options are
// returned in order), "--" ends the options, POSIXLY_CORRECT stops at the
// first non-option, an option's argument is taken whatever it looks like,
// long options may be abbreviated, and errors read as glibc's.
func TestGetopt(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		posix bool
		opts  []opt
		rest  []string
		err   string
	}{
		{name: "options only", args: []string{"-m", "239.1.1.1", "-s", "-b127.0.0.1"},
			opts: []opt{{"m", "239.1.1.1"}, {"s", ""}, {"b", "127.0.0.1"}}},
		{name: "non-option first", args: []string{"extra", "-m", "239.1.1.1", "-s"},
			opts: []opt{{"m", "239.1.1.1"}, {"s", ""}}, rest: []string{"extra"}},
		{name: "non-options between options", args: []string{"-s", "a", "-m", "g", "b", "--verify", "c"},
			opts: []opt{{"s", ""}, {"m", "g"}, {"verify", ""}}, rest: []string{"a", "b", "c"}},
		{name: "double dash ends options", args: []string{"x", "-s", "--", "-m", "g"},
			opts: []opt{{"s", ""}}, rest: []string{"x", "-m", "g"}},
		{name: "single dash is a non-option", args: []string{"-", "-o"},
			opts: []opt{{"o", ""}}, rest: []string{"-"}},
		{name: "POSIXLY_CORRECT stops at a non-option", args: []string{"-s", "x", "-m", "g"}, posix: true,
			opts: []opt{{"s", ""}}, rest: []string{"x", "-m", "g"}},
		{name: "grouped flags and an attached argument", args: []string{"-solC5"},
			opts: []opt{{"s", ""}, {"o", ""}, {"l", ""}, {"C", "5"}}},
		{name: "an argument that looks like an option", args: []string{"-m", "-s", "-b", "--", "x"},
			opts: []opt{{"m", "-s"}, {"b", "--"}}, rest: []string{"x"}},
		{name: "long option forms", args: []string{"--timeout=1s", "y", "--join-pause", "0s", "--no-imm"},
			opts: []opt{{"timeout", "1s"}, {"join-pause", "0s"}, {"no-imm", ""}}, rest: []string{"y"}},
		{name: "abbreviated long options", args: []string{"--ver", "--time", "2s", "--if=lo"},
			opts: []opt{{"verify", ""}, {"timeout", "2s"}, {"iface", "lo"}}},
		{name: "invalid option after a non-option", args: []string{"x", "-q"}, err: "invalid option -- 'q'"},
		{name: "colon is no option", args: []string{"-:"}, err: "invalid option -- ':'"},
		{name: "missing argument", args: []string{"x", "-b"}, err: "option requires an argument -- 'b'"},
		{name: "unrecognized long option", args: []string{"--bogus=1"}, err: "unrecognized option '--bogus=1'"},
		{name: "missing long argument", args: []string{"--time"}, err: "option '--timeout' requires an argument"},
		{name: "argument to a long flag", args: []string{"--verif=yes"}, err: "option '--verify' doesn't allow an argument"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts, rest, err := getopt(tc.args, optString, longOpts(), tc.posix)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("getopt(%q): error %v, want %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(opts, tc.opts) || !reflect.DeepEqual(rest, tc.rest) {
				t.Fatalf("getopt(%q) = %v, %q, %v; want %v, %q", tc.args, opts, rest, err, tc.opts, tc.rest)
			}
		})
	}
	// Ambiguous prefixes: none among mckey's long options, so a made-up set.
	_, _, err := getopt([]string{"--ve"}, "", []longOpt{{"verbose", false}, {"verify", false}}, false)
	if want := "option '--ve' is ambiguous; possibilities: '--verbose' '--verify'"; err == nil || err.Error() != want {
		t.Errorf("ambiguous prefix: %v, want %q", err, want)
	}
}
