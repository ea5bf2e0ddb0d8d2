package ackline.example;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Instant;
import java.time.format.DateTimeFormatter;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A service outside Python emitting agent activity for ackline (docs/producing.md).
 *
 * <p>Every event is an envelope of schemas/json/envelope.v1.schema.json, serialized to bytes
 * once; one request's events are one Kafka transaction. Then, as a service does when it cannot
 * know whether a commit happened (its process died right after commitTransaction, before it
 * recorded success), a new producer instance with the same transactional.id resends the first
 * request's records: the same bytes. ackline stores every event once and counts the resend as
 * duplicates.
 *
 * <p>Usage: {@code ActivityProducerExample BOOTSTRAP TOPIC TRANSACTIONAL_ID TAG}. Prints one JSON
 * line per delivered record: event_id, txn_id, partition, offset, resend. Exits with status 3
 * (EXIT_OUTCOME_UNKNOWN) when a commit's outcome is unknown.
 */
public final class ActivityProducerExample {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int COMMIT_ATTEMPTS = 5;
  private static final int TRANSACTION_ROUNDS = 3;
  static final int EXIT_OUTCOME_UNKNOWN = 3;

  /** One event ready for the wire: key and value are fixed bytes, sent as they are on retry. */
  record Outgoing(byte[] key, byte[] value, String type, String eventId, String txnId) {}

  private ActivityProducerExample() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: ActivityProducerExample BOOTSTRAP TOPIC TRANSACTIONAL_ID TAG");
      System.exit(2);
    }
    String bootstrap = args[0];
    String topic = args[1];
    String transactionalId = args[2];
    String tag = args[3];

    List<Outgoing> first = unitOfWork(tag + "-r1", "java-agent-1");
    List<Outgoing> second = unitOfWork(tag + "-r2", "java-agent-2");

    try (KafkaProducer<byte[], byte[]> producer = start(config(bootstrap, transactionalId))) {
      print(first, sendTransaction(producer, topic, first), false);
      print(second, sendTransaction(producer, topic, second), false);
    } catch (CommitOutcomeUnknown e) {
      exitOutcomeUnknown(e); // the instance is closed (try-with-resources), never aborted
    }
    // The forced resend: the first request's outcome is treated as unknown. A new instance
    // with the same transactional.id (it fences any older one) sends the same bytes again.
    try (KafkaProducer<byte[], byte[]> producer = start(config(bootstrap, transactionalId))) {
      print(first, sendTransaction(producer, topic, first), true);
    }
  }

  /**
   * A commit whose outcome is unknown: it timed out COMMIT_ATTEMPTS times, and may still complete.
   * Not a KafkaException, so that sendTransaction lets it through without an abort.
   */
  static final class CommitOutcomeUnknown extends RuntimeException {
    private static final long serialVersionUID = 1L;

    CommitOutcomeUnknown(TimeoutException last) {
      super(
          "commit outcome unknown: it timed out "
              + COMMIT_ATTEMPTS
              + " times and may still complete; this instance is closed without an abort."
              + " Resend the same records from a new instance with the same transactional.id",
          last);
    }
  }

  /**
   * Ends the process after a commit whose outcome is unknown: the message on stderr, exit status
   * EXIT_OUTCOME_UNKNOWN. Whoever holds the records resends the same bytes from a new instance.
   */
  static void exitOutcomeUnknown(CommitOutcomeUnknown e) {
    System.err.println(e.getMessage() + " (" + e.getCause() + ")");
    System.exit(EXIT_OUTCOME_UNKNOWN);
  }

  static Properties config(String bootstrap, String transactionalId) {
    Properties conf = new Properties();
    conf.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    conf.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
    conf.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    conf.put(ProducerConfig.ACKS_CONFIG, "all");
    conf.put(ProducerConfig.LINGER_MS_CONFIG, 10);
    conf.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
    conf.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 60_000);
    conf.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    conf.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    return conf;
  }

  static KafkaProducer<byte[], byte[]> start(Properties conf) {
    KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(conf);
    producer.initTransactions(); // fences older instances, settles their open transaction
    return producer;
  }

  /**
   * Sends the records in one transaction and commits it; returns where each landed.
   *
   * <p>A commit that times out is called again (it may already be completing: nothing else is
   * allowed then, not even an abort); after COMMIT_ATTEMPTS timeouts CommitOutcomeUnknown ends
   * this instance, with the transaction neither aborted nor known to be committed. Any other
   * KafkaException aborts (a send() that timed out on metadata or buffer space too: the client
   * puts that error in its Future and commitTransaction then refuses with a KafkaException), and
   * the same bytes go out in a new transaction. Fenced, out-of-order and authorization errors end
   * this instance. After either ending: close it; whoever takes the work over resends the same
   * records from a new instance.
   *
   * <p>Order of effects: records sent, commit, metadata returned. A crash before the commit
   * leaves an open transaction that the next initTransactions with this transactional.id (or the
   * transaction timeout) aborts; a crash during the commit leaves it committed or not, unknown:
   * the resend's copies are counted as duplicates by ackline.
   */
  static List<RecordMetadata> sendTransaction(
      KafkaProducer<byte[], byte[]> producer, String topic, List<Outgoing> records)
      throws InterruptedException, ExecutionException {
    for (int round = 1; ; round++) {
      try {
        producer.beginTransaction();
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        for (Outgoing r : records) {
          ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(topic, r.key(), r.value());
          rec.headers().add("content-type", "application/json".getBytes(StandardCharsets.UTF_8));
          rec.headers().add("ackline.type", r.type().getBytes(StandardCharsets.UTF_8));
          rec.headers().add("ackline.schema-version", "1".getBytes(StandardCharsets.UTF_8));
          sent.add(producer.send(rec));
        }
        commit(producer);
        List<RecordMetadata> out = new ArrayList<>();
        for (Future<RecordMetadata> f : sent) {
          out.add(f.get()); // done: the commit flushed every record
        }
        return out;
      } catch (ProducerFencedException | OutOfOrderSequenceException | AuthorizationException e) {
        throw e; // this instance can do nothing more; try-with-resources closes it
      } catch (KafkaException e) { // CommitOutcomeUnknown is none: it is never aborted
        producer.abortTransaction();
        if (round == TRANSACTION_ROUNDS) {
          throw e;
        }
        System.err.println("transaction aborted, sending the same records again: " + e);
      }
    }
  }

  /**
   * Commits, calling commitTransaction again while it times out (max.block.ms). Kafka allows
   * only that retry after a timed-out commit: an abort then throws IllegalStateException.
   */
  static void commit(KafkaProducer<byte[], byte[]> producer) {
    for (int attempt = 1; ; attempt++) {
      try {
        producer.commitTransaction();
        return;
      } catch (TimeoutException e) {
        if (attempt == COMMIT_ATTEMPTS) {
          System.err.println("commit timed out " + attempt + " times, giving up: " + e);
          throw new CommitOutcomeUnknown(e); // close; resend the same bytes from a new instance
        }
        System.err.println("commit timed out, calling it again: " + e);
      }
    }
  }

  /**
   * One request served by one agent run. txn_id is the idempotency key of each event's unit of
   * work: req:REQUEST for the request, start:REQUEST for the agent serving it (one request, one
   * agent), RUN:SEQ for each later event. event_id is random, stamped once with occurred_at.
   */
  static List<Outgoing> unitOfWork(String request, String agent) throws Exception {
    String run = "run-" + request;
    List<Outgoing> out = new ArrayList<>();
    ObjectNode requested = JSON.createObjectNode();
    requested.put("prompt", "Summarise the ticket \"Ünïcode ☃\"\nand reply");
    requested.put("requested_by", "user-7");
    requested.put("priority", 3);
    requested.putArray("tools").add("search").add("calculator");
    out.add(envelope("agent.requested", "req:" + request, agent, request, requested));

    ObjectNode started = JSON.createObjectNode();
    started.put("run_id", run);
    started.put("model", "model-x");
    out.add(envelope("agent.started", "start:" + request, agent, request, started));

    ObjectNode step = JSON.createObjectNode();
    step.put("run_id", run);
    step.put("step", 0);
    step.put("thought", "look the ticket up");
    out.add(envelope("agent.step", run + ":" + out.size(), agent, request, step));

    ObjectNode called = JSON.createObjectNode();
    called.put("run_id", run);
    called.put("call_id", "call-1");
    called.put("tool", "search");
    ObjectNode arguments = called.putObject("arguments");
    arguments.put("query", "ticket 42");
    arguments.put("limit", 5);
    arguments.put("threshold", 0.75);
    arguments.putArray("fields").add("title").add("body");
    out.add(envelope("tool.called", run + ":" + out.size(), agent, request, called));

    ObjectNode result = JSON.createObjectNode();
    result.put("run_id", run);
    result.put("call_id", "call-1");
    result.put("ok", true);
    result.put("output", "1 hit");
    result.put("duration_ms", 42);
    out.add(envelope("tool.result", run + ":" + out.size(), agent, request, result));

    ObjectNode posted = JSON.createObjectNode();
    posted.put("run_id", run);
    posted.put("role", "assistant");
    posted.put("content", "Here is the summary.");
    out.add(envelope("message.posted", run + ":" + out.size(), agent, request, posted));

    ObjectNode finished = JSON.createObjectNode();
    finished.put("run_id", run);
    finished.put("steps", 1);
    finished.put("tokens_in", 1200);
    finished.put("tokens_out", 300);
    finished.put("summary", "done");
    out.add(envelope("agent.finished", run + ":" + out.size(), agent, request, finished));
    return out;
  }

  private static final SecureRandom RANDOM = new SecureRandom();

  /**
   * A time-ordered UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.
   * ackline's key index stays on its recent pages with these (random v4 ids also work).
   */
  static UUID uuid7(Instant at) {
    long msb = (at.toEpochMilli() << 16) | 0x7000L | (RANDOM.nextInt() & 0x0FFFL);
    long lsb = (RANDOM.nextLong() & 0x3FFFFFFFFFFFFFFFL) | 0x8000000000000000L;
    return new UUID(msb, lsb);
  }

  static Outgoing envelope(
      String type, String txnId, String agent, String request, ObjectNode payload)
      throws Exception {
    Instant now = Instant.now().truncatedTo(ChronoUnit.MICROS); // ackline keeps microseconds
    String eventId = uuid7(now).toString();
    ObjectNode env = JSON.createObjectNode();
    env.put("event_id", eventId);
    env.put("txn_id", txnId);
    env.put("type", type);
    env.put("agent_id", agent);
    env.put("request_id", request);
    env.put("occurred_at", DateTimeFormatter.ISO_INSTANT.format(now)); // UTC, ends in Z
    env.put("schema_version", 1);
    env.set("payload", payload);
    byte[] value = JSON.writeValueAsBytes(env); // once: every attempt sends these bytes
    return new Outgoing(agent.getBytes(StandardCharsets.UTF_8), value, type, eventId, txnId);
  }

  static void print(List<Outgoing> records, List<RecordMetadata> where, boolean resend) {
    for (int i = 0; i < records.size(); i++) {
      ObjectNode line = JSON.createObjectNode();
      line.put("event_id", records.get(i).eventId());
      line.put("txn_id", records.get(i).txnId());
      line.put("partition", where.get(i).partition());
      line.put("offset", where.get(i).offset());
      line.put("resend", resend);
      System.out.println(line);
    }
  }
}
