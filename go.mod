module github.com/starintel/starlease

go 1.26.8

require (
	github.com/oklog/ulid/v2 v2.1.2
	github.com/valkey-io/valkey-go v1.0.80
	go.etcd.io/bbolt v1.5.0
	golang.org/x/text v0.44.0
)

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
