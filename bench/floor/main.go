// The floor under an extender's answer: the least any extender does, in kube-scheduler's own stack.
//
// Go's net/http (what kube-scheduler itself serves and calls with), one handler: read the POST body,
// parse it as JSON (every extender must read the pod and the node names to decide), answer constant
// bytes (the extender's own answer to such a request, so the answer costs the same to write and send).
// bench/cluster_scale.py builds it with the local Go toolchain and times it beside the extender and
// bench/echo.py in the same churn: what this server takes on the machine, no extender design beats.
//
//	floor-server -port 9000 -answer FILE
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
)

func main() {
	port := flag.Int("port", 0, "port on 127.0.0.1")
	answerFile := flag.String("answer", "", "the constant answer to every POST")
	flag.Parse()
	answer, err := os.ReadFile(*answerFile)
	if err != nil {
		log.Fatalf("floor-server: -answer: %v", err)
	}
	http.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var args map[string]any
		if err == nil {
			err = json.Unmarshal(body, &args)
		}
		if err != nil {
			http.Error(w, `{"error":"bad body"}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = w.Write(answer)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:"+strconv.Itoa(*port), nil))
}
