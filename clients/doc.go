// Package clients holds starlease's clients for the languages StarIntel's
// actors are written in: python/ (standard library only) and nim/
// (standard library only). Neither links the Go store: they speak the HTTP
// API that httpapi/openapi.json describes.
//
// The Go tests of this package run each client's own suite (pytest,
// nim c -r) against real servers the harness starts: starlease serve on
// bolt with its relay, RabbitMQ and a CouchDB-protocol server, all on
// 127.0.0.1. A missing interpreter or compiler fails the run with the
// command that installs it; nothing is skipped.
package clients
