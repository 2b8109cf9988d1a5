// Command starlease is the target-lease service of the StarIntel OSINT
// platform. This first version offers "version" and a local mode: every lease
// command works directly on the embedded bolt store in a data directory.
//
// Run "starlease help" for the commands, their output and exit statuses.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
