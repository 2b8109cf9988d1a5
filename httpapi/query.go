package httpapi

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/starintel/starlease/lease"
)

// strictQuery is r's query, every parameter in known and given once. A
// pair url.ParseQuery cannot parse (a ';', a bad %-escape), which
// r.URL.Query would silently drop, an unknown parameter and a repeated one
// are each 400 invalid_lease_request with the parameter as field, so no
// check on the query can be sidestepped by a pair it does not see.
func strictQuery(r *http.Request, known ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, lease.Invalid(malformedParam(r.URL.RawQuery), "is not a well-formed query parameter (no ';', %-escapes must be valid)")
	}
	for k, v := range q {
		switch {
		case !slices.Contains(known, k):
			return nil, lease.Invalid(paramField(k), "is not a known query parameter")
		case len(v) != 1:
			return nil, lease.Invalid(k, "give it once")
		}
	}
	return q, nil
}

// malformedParam names the first pair of a raw query url.ParseQuery
// refuses: its key, unescaped if it can be.
func malformedParam(raw string) string {
	for pair := range strings.SplitSeq(raw, "&") {
		if _, err := url.ParseQuery(pair); err == nil {
			continue
		}
		k, _, _ := strings.Cut(pair, "=")
		if u, err := url.QueryUnescape(k); err == nil {
			k = u
		}
		return paramField(k)
	}
	return "query"
}

// paramField is the error field naming parameter k ("query" for an empty
// name).
func paramField(k string) string {
	if k == "" {
		return "query"
	}
	return k
}

// queryInt is the non-negative integer parameter name of q, 0 if absent.
func queryInt(q url.Values, name string) (int, error) {
	v := q.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, lease.Invalid(name, "must be a non-negative integer")
	}
	return n, nil
}
