// Package syncdir makes a directory's entries durable: a file created,
// renamed or removed there survives a crash only once its directory is
// fsynced too.
package syncdir

import "os"

// Sync fsyncs the directory dir.
func Sync(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
