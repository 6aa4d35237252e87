#include "runtime/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace te {

int cpu_num_threads() {
  static const int threads = [] {
    if (const char* env = std::getenv("TE_NUM_THREADS")) {
      const int n = std::atoi(env);
      if (n > 0) return n;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }();
  return threads;
}

namespace {

// One parallel_for in flight: its chunks are claimed through `next_chunk` by
// the caller and the pool's workers alike.
struct Job {
  const std::function<void(int64_t, int64_t)>* body = nullptr;
  int64_t n = 0, chunk = 1, chunks = 0;
  std::atomic<int64_t> next_chunk{0};
  std::atomic<int64_t> done_chunks{0};
  std::exception_ptr error;
  std::mutex error_mutex;

  // Runs chunks until none is left; true when this call finished the last one.
  bool work() {
    bool finished_last = false;
    for (int64_t c = next_chunk.fetch_add(1); c < chunks; c = next_chunk.fetch_add(1)) {
      const int64_t begin = c * chunk, end = std::min(n, begin + chunk);
      try {
        (*body)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      finished_last = done_chunks.fetch_add(1) + 1 == chunks;
    }
    return finished_last;
  }
};

// Worker threads started once and kept: starting threads per op cost tens of
// microseconds, a visible share of the small ops of a training step. One job
// at a time; a parallel_for that finds the pool busy (another thread's, or a
// nested call from inside a body) runs on its own thread instead.
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool(cpu_num_threads() - 1);  // (never destroyed: workers detach)
    return *pool;
  }

  // Runs the job on the caller and the workers; false when the pool was busy.
  bool run(Job* job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || forked_child_) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = job;
      ++generation_;
    }
    wake_.notify_all();
    job->work();
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return job->done_chunks.load() == job->chunks && active_ == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  explicit Pool(int workers) {
    // A child of fork() has none of these threads: it runs everything inline.
    pthread_atfork(nullptr, nullptr, [] { Pool::instance().forked_child_ = true; });
    for (int i = 0; i < workers; ++i) std::thread([this] { loop(); }).detach();
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen && job_ != nullptr; });
        seen = generation_;
        job = job_;
        ++active_;
      }
      job->work();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --active_;
      }
      finished_.notify_all();
    }
  }

  std::mutex busy_;   // held by the thread whose job the pool runs
  std::mutex mutex_;  // guards job_, generation_, active_
  std::condition_variable wake_, finished_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int active_ = 0;  // workers inside job_->work()
  bool forked_child_ = false;
};

}  // namespace

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int64_t max_workers = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int workers = static_cast<int>(std::min<int64_t>(cpu_num_threads(), max_workers));
  Job job;
  job.body = &body;
  job.n = n;
  job.chunk = (n + workers - 1) / workers;
  job.chunks = (n + job.chunk - 1) / job.chunk;
  if (workers <= 1 || !Pool::instance().run(&job)) {
    body(0, n);
    return;
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace te
