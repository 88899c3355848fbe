// dashboard-check decodes Grafana dashboard JSON files strictly against Grafana's dashboard
// schema, as grafana-foundation-sdk generates it from Grafana's own definitions: a field
// Grafana does not know, a value of the wrong type or a missing required field is an error,
// down to every panel's options and every Prometheus query. Prints one line per file; exits
// 1 if any file fails.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-check DASHBOARD.json...")
		os.Exit(2)
	}
	// panel options and data queries are decoded by their plugin's types
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, path := range os.Args[1:] {
		if err := check(path); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var d dashboard.Dashboard
	if err := real(d.UnmarshalJSONStrict(raw)); err != nil {
		return fmt.Errorf("not a Grafana dashboard:\n%w", err)
	}
	if err := real(d.Validate()); err != nil {
		return fmt.Errorf("invalid:\n%w", err)
	}
	fmt.Printf("%s: valid, %d panels\n", path, len(d.Panels))
	return nil
}

// real is err unless it is an empty list of errors: the SDK returns its (nil) error list
// as an error interface, which is never nil.
func real(err error) error {
	var list cog.BuildErrors
	if errors.As(err, &list) && len(list) == 0 {
		return nil
	}
	return err
}
