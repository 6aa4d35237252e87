# Sourced by the run_*.sh drivers: compile_objects compiles each file of the
# `sources` array with nvcc and the `flags` array into "$build", one compiler
# per source in parallel (ptxas reports go to <object>.log), and fills the
# `objects` array. On a failed compile it prints the logs and exits.
compile_objects() {
  local pids=() src obj pid status=0
  objects=()
  for src in "${sources[@]}"; do
    obj="$build/$(basename "$src").o"
    objects+=("$obj")
    nvcc "${flags[@]}" -c "$src" -o "$obj" 2> "$obj.log" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  if [ "$status" != 0 ]; then
    cat "$build"/*.log
    exit 1
  fi
}
