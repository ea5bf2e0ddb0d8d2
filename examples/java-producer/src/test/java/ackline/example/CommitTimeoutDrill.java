package ackline.example;

import static ackline.example.ActivityProducerExample.config;
import static ackline.example.ActivityProducerExample.exitOutcomeUnknown;
import static ackline.example.ActivityProducerExample.print;
import static ackline.example.ActivityProducerExample.sendTransaction;
import static ackline.example.ActivityProducerExample.start;
import static ackline.example.ActivityProducerExample.unitOfWork;

import ackline.example.ActivityProducerExample.CommitOutcomeUnknown;
import ackline.example.ActivityProducerExample.Outgoing;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;

/**
 * Test-only, not part of the example: a commit that really times out, run through the example's
 * own sendTransaction and exit path (tests/integration/test_java_producer.py freezes the broker).
 *
 * <p>{@code CommitTimeoutDrill BOOTSTRAP TOPIC TRANSACTIONAL_ID TAG hold}: prints one request's
 * records as one JSON line (what a service keeps until it knows the commit's outcome), waits for a
 * line on stdin, then sends and commits them with a short max.block.ms; with the broker frozen
 * meanwhile, the commit times out and the process ends as the example's main does.
 *
 * <p>{@code ... resend}: reads that JSON line on stdin and sends the same bytes from a new instance
 * with the same transactional.id, printing the example's lines (resend: true).
 */
public final class CommitTimeoutDrill {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int MAX_BLOCK_MS = 2_000; // each commit attempt times out after this

  private CommitTimeoutDrill() {}

  public static void main(String[] args) throws Exception {
    String bootstrap = args[0];
    String topic = args[1];
    String transactionalId = args[2];
    BufferedReader stdin =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    if (args[4].equals("resend")) {
      List<Outgoing> records = decode(stdin.readLine());
      try (KafkaProducer<byte[], byte[]> producer = start(config(bootstrap, transactionalId))) {
        print(records, sendTransaction(producer, topic, records), true);
      }
      return;
    }
    List<Outgoing> records = unitOfWork(args[3] + "-r1", "java-agent-1");
    // The default max.block.ms first: a new broker's first InitProducerId may take seconds.
    start(config(bootstrap, transactionalId)).close();
    Properties conf = config(bootstrap, transactionalId);
    conf.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, MAX_BLOCK_MS);
    try (KafkaProducer<byte[], byte[]> producer = start(conf)) {
      producer.partitionsFor(topic); // cached: send() does not wait for the frozen broker
      System.out.println(encode(records));
      stdin.readLine();
      print(records, sendTransaction(producer, topic, records), false);
    } catch (CommitOutcomeUnknown e) {
      exitOutcomeUnknown(e);
    }
  }

  static String encode(List<Outgoing> records) {
    ArrayNode out = JSON.createArrayNode();
    for (Outgoing r : records) {
      out.addObject()
          .put("key", Base64.getEncoder().encodeToString(r.key()))
          .put("value", Base64.getEncoder().encodeToString(r.value()))
          .put("type", r.type())
          .put("event_id", r.eventId())
          .put("txn_id", r.txnId());
    }
    return out.toString();
  }

  static List<Outgoing> decode(String line) throws Exception {
    List<Outgoing> records = new ArrayList<>();
    for (JsonNode r : JSON.readTree(line)) {
      records.add(
          new Outgoing(
              Base64.getDecoder().decode(r.get("key").asText()),
              Base64.getDecoder().decode(r.get("value").asText()),
              r.get("type").asText(),
              r.get("event_id").asText(),
              r.get("txn_id").asText()));
    }
    return records;
  }
}
