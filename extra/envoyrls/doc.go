// Package envoyrls serves Envoy's global rate-limit API.
package envoyrls
